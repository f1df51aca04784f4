"""Every backend of the registry names a pip extra that pyproject.toml declares and that installs
its framework: the extra a missing backend's message tells a user to install does install it."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from udfserve.runtime.backend_registry import FORMATS, BackendFormat

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def distributions_of(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The distributions an extra installs, the extras of udfserve it names included."""
    names: set[str] = set()
    for line in EXTRAS[extra]:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "udfserve":
            for inner in requirement.extras - seen:
                names |= distributions_of(inner, seen | {extra})
        else:
            names.add(canonicalize_name(requirement.name))
    return names


@pytest.mark.parametrize("format_", FORMATS, ids=lambda format_: format_.backend)
def test_each_backends_extra_is_declared_and_installs_its_framework(format_: BackendFormat) -> None:
    assert format_.extra in EXTRAS, f"{format_.backend}: no extra {format_.extra!r} in pyproject.toml"
    assert canonicalize_name(format_.module) in distributions_of(format_.extra), (
        f"{format_.backend}: the extra {format_.extra!r} does not install {format_.module!r}"
    )

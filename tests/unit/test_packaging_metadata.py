"""What the package publishes: a server extra without a framework, no pinned development tool in
its metadata, and a development environment that still holds every backend's framework.

A user's resolver reads the extras; a pin there (``torch==2.13.0``) would bind every environment
that installs udfserve, and a framework in ``server`` would put 1.8 GiB of TensorFlow on a node
that serves only ONNX models. The development tools are dependency groups (PEP 735), which the
published metadata does not carry.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from udfserve.runtime.backend_registry import FORMATS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
GROUPS: dict[str, list[object]] = PYPROJECT["dependency-groups"]
FRAMEWORKS = {"tensorflow", "onnxruntime", "torch", "xgboost", "xgboost-cpu"}


def _names(requirements: list[object]) -> set[str]:
    return {canonicalize_name(Requirement(line).name) for line in requirements if isinstance(line, str)}


def _dev_extras() -> list[str]:
    """The extras scripts/venv.sh installs with the dev group."""
    venv_script = (ROOT / "scripts" / "venv.sh").read_text(encoding="utf-8")
    match = re.search(r'^DEV_EXTRAS="([^"]+)"', venv_script, re.MULTILINE)
    assert match, "scripts/venv.sh declares no DEV_EXTRAS"
    return match.group(1).split(",")


def test_the_server_extra_installs_no_framework_and_no_tritonclient() -> None:
    names = _names(list(EXTRAS["server"]))

    assert not names & (FRAMEWORKS | {"tritonclient"}), names & (FRAMEWORKS | {"tritonclient"})


def test_no_extra_pins_an_exact_version() -> None:
    pinned = [
        f"{extra}: {line}"
        for extra, lines in EXTRAS.items()
        for line in lines
        if any(spec.operator in ("==", "===") for spec in Requirement(line).specifier)
    ]

    assert pinned == []


def test_no_extra_is_a_development_tool_set() -> None:
    assert not {"dev", "bench", "bench-ray"} & set(EXTRAS), "development tools belong in dependency groups"


def test_the_development_environment_installs_every_backends_framework() -> None:
    installed = _names(list(GROUPS["dev"]))
    for extra in _dev_extras():
        assert extra in EXTRAS, f"scripts/venv.sh's DEV_EXTRAS names {extra!r}, which pyproject.toml lacks"
        for line in EXTRAS[extra]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == "udfserve":
                installed |= {name for inner in requirement.extras for name in _names(list(EXTRAS[inner]))}
            else:
                installed.add(canonicalize_name(requirement.name))
    cpu_builds = {"xgboost": "xgboost-cpu"}  # the same module without CUDA, for a machine without a GPU

    missing = [
        format_.backend
        for format_ in FORMATS
        if canonicalize_name(format_.module) not in installed
        and cpu_builds.get(canonicalize_name(format_.module)) not in installed
    ]

    assert missing == []

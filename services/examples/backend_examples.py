"""The example models that backends bring, through the registry: ``udfserve models generate
--backend-examples <name>``.

A registry entry whose ``examples`` names a ``module:function`` brings its own examples (the
XGBoost backend's ``tabular_xgb``); the option's choices, its checks and its calls are read from
the registry, so a backend that adds examples adds nothing here.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from pathlib import Path

from udfserve.runtime.backend_registry import FORMAT_BY_BACKEND, FORMATS
from udfserve.runtime.backends import backend_installed

BACKEND_EXAMPLES_HELP = (
    "also write the example models a backend brings, by backend name, comma-separated: "
    "{names} (backend_registry's entries with examples; each needs its backend's framework)"
)


def backends_with_examples() -> tuple[str, ...]:
    """The backends whose registry entry names an example generator."""
    return tuple(format_.backend for format_ in FORMATS if format_.examples)


def backend_example_names(text: str) -> tuple[str, ...]:
    """``--backend-examples``' value: backend names, comma-separated; ``ValueError`` naming any
    that brings no examples."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    known = backends_with_examples()
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(f"--backend-examples {text!r}: expected some of {', '.join(known)}")
    return names


def backend_examples_missing(backends: Sequence[str]) -> str:
    """Why ``--backend-examples`` cannot run here ("" when it can): the backends' frameworks."""
    missing = [FORMAT_BY_BACKEND[name] for name in backends if not backend_installed(name)]
    return "; ".join(
        f"--backend-examples {format_.backend} needs {format_.module}, which is not installed: expected "
        f"`pip install 'udfserve[{format_.extra}]'`"
        for format_ in missing
    )


def generate_backend_examples(root: Path, backends: Sequence[str], *, overwrite: bool = False) -> list[str]:
    """Write the example models of ``backends`` under ``root`` through each registry entry's
    ``examples`` function; returns their names."""
    names: list[str] = []
    for backend in backends:
        module_name, _, function_name = FORMAT_BY_BACKEND[backend].examples.partition(":")
        write = getattr(importlib.import_module(module_name), function_name)
        names += write(Path(root), overwrite=overwrite)
    return names


def add_backend_examples_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend-examples``, its choices from the registry."""

    def parse(text: str) -> tuple[str, ...]:
        try:
            return backend_example_names(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parser.add_argument(
        "--backend-examples",
        type=parse,
        default=(),
        metavar="NAME[,NAME]",
        help=BACKEND_EXAMPLES_HELP.format(names=", ".join(backends_with_examples())),
    )

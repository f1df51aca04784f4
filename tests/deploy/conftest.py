"""Fixtures of the deployment tests: the compose file, and compose services run as processes
(see compose_harness.py for how a service's command is translated to run here)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compose_harness import (
    CONTAINER_MODELS,
    ComposeNode,
    child_environment,
    local_argv,
    start_compose_node,
    translate_path,
)
from deploy_files import argv_of, load_compose


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="session")
def compose_models(compose: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repository, written by the compose `models` service's own command."""
    output = tmp_path_factory.mktemp("compose-models")
    argv = [
        translate_path(w, {CONTAINER_MODELS: output})
        for w in argv_of(compose["services"]["models"]["command"])
    ]
    subprocess.run(local_argv(argv), check=True, capture_output=True, timeout=300, env=child_environment({}))
    return output


@pytest.fixture(scope="module")
def gpu_compose_node(compose: dict[str, Any], compose_models: Path) -> Iterator[ComposeNode]:
    """The `udfserve-node` service (the default profile); NVML finds no GPU here: it serves on the CPU."""
    yield from start_compose_node(compose, "udfserve-node", compose_models)

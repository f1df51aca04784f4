"""Shared fixtures and tier markers.

Tiers follow folders: ``tests/unit`` (no sockets, no Spark), ``tests/backend`` (real
TensorFlow in-process), ``tests/integration`` and ``tests/node`` (real server processes),
``tests/spark`` (real PySpark), ``tests/deploy`` (deployment files checked against the code).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_TIERS = {
    "unit": "unit",
    "backend": "integration",
    "integration": "integration",
    "node": "integration",
    "spark": "spark",
    "deploy": "integration",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        tier = _TIERS.get(parts[0]) if len(parts) > 1 else None
        if tier:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example model repository, generated once per test session by the project's own command.

    Generated in a child process so that test processes which only talk to servers never
    import TensorFlow themselves.
    """
    root = tmp_path_factory.mktemp("model_repository")
    subprocess.run(
        [sys.executable, "-m", "services", "models", "generate", "--output", str(root), "--savedmodel"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return root

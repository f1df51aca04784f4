"""Backend tests run real TensorFlow on the example models the project's own generator writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.examples.generate_models import generate_example_repository


@pytest.fixture(scope="session")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model_repository")
    generate_example_repository(root, include_savedmodel=True)
    return root

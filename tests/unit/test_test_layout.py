"""The test tree itself: module basenames must be unique across tiers.

Tests are collected with pytest's default import mode, in which two ``test_x.py`` files in
different folders collide and the run stops at collection.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_unique_basename() -> None:
    names = Counter(path.name for path in TESTS.rglob("*.py") if path.name != "conftest.py")
    assert [name for name, count in names.items() if count > 1] == []

"""The fairness comparison keeps working: its quick mode loads a first-in-first-out server and a
fair one with a busy and a small application, alone and together, then runs two real Spark
applications side by side, and reports every cell and target (whether the short run meets them
is not asserted: it is a benchmark's to measure, on a quiet machine)."""

from __future__ import annotations

import pytest
from benchmark_script import run_quick

MODES = {"fifo", "fair"}
APPS = {"busy (16 streams)", "small (2 streams)"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_quick_fairness_comparison_measures_both_applications_under_both_schedulings() -> None:
    result = run_quick("benchmarks.fairness", timeout_s=840)
    cells = result["raw"]["cells"]

    measured = {(cell["mode"], cell["app"], cell["together"]) for cell in cells}
    assert measured == {(mode, app, together) for mode in MODES for app in APPS for together in (False, True)}
    assert all(cell["rows_s"] > 0 for cell in cells)
    # the server's per-application queue wait, under either scheduling (NaN, not >= 0, when unmeasured)
    assert all(cell["queue_wait_ms"] >= 0 for cell in cells)
    assert len(result["targets"]) == 2 and all(target["met"] is not None for target in result["targets"])
    spark = result["raw"]["spark_cells"]
    assert {(cell["app"], cell["together"]) for cell in spark} == {(app, True) for app in APPS}
    assert all(cell["rows_s"] > 0 for cell in spark)

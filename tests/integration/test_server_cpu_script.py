"""The server CPU benchmark keeps working: its quick mode runs this tree's server beside a baseline
commit's, loads both with the Spark client's stream through shared memory, and prints one row of
CPU per row for each, with the per-round ratio against the baseline."""

from __future__ import annotations

import pytest
from benchmark_script import run_module


def table_rows(output: str) -> dict[str, list[str]]:
    """The printed table's rows by tree: its cells, the header and the rule left out."""
    lines = [line for line in output.splitlines() if line.startswith("| ") and not line.startswith("| tree")]
    split = ([cell.strip() for cell in line.strip("|").split("|")] for line in lines)
    return {cells[0]: cells[1:] for cells in split}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_quick_run_measures_this_tree_beside_the_baseline_commit() -> None:
    rows = table_rows(run_module("benchmarks.server_cpu", ["--quick", "--baseline", "HEAD"], timeout_s=240))
    baseline = next(tree for tree in rows if tree.startswith("baseline "))
    assert set(rows) == {"this tree", baseline}
    for tree, cells in rows.items():
        rate, per_million, per_request, event_loop = (float(cell.replace(",", "")) for cell in cells[:4])
        assert rate > 0 and per_million > 0, tree
        assert 0 < event_loop <= per_request, tree  # the event loop's thread is part of the process
    ratio = rows["this tree"][-1]
    assert ratio and float(ratio.split()[0]) > 0
    assert rows[baseline][-1] == ""

"""The worker-memory benchmark's baseline runs the baseline checkout's client, or reports nothing.

A checkout's ``udfserve/`` lacks ``spark_client`` (setup.py maps it in), so with a checkout
first on the path the editable install's hook used to answer ``udfserve.spark_client`` from this
checkout: the baseline variant measured the current client. ``baseline_path`` is checked here in
a real interpreter of this environment, started in this checkout as Spark starts its workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.client_trees import (
    REPO_ROOT,
    WrongTreeError,
    baseline_checkout,
    baseline_path,
    check_trees,
)


def _checkout(root: Path) -> Path:
    """A checkout's layout, small: ``udfserve/``, and ``spark_client/`` that setup.py maps in."""
    for folder in ("udfserve", "spark_client", "spark_client/executor", "services"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    return root


def test_the_baseline_path_imports_the_baseline_client_and_this_checkouts_harness(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path / "old")
    path = baseline_path(checkout, tmp_path / "links")
    code = (
        "import json, udfserve.spark_client.executor, benchmarks.worker_smaps as w; "
        "print(json.dumps([w.udfserve_files(), w.__file__]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,  # where a worker's `python -m` would find this checkout's udfserve first
        env={**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    files, harness = json.loads(done.stdout)
    assert set(files) == {"udfserve", "udfserve.spark_client", "udfserve.spark_client.executor"}
    assert all(Path(file).is_relative_to(checkout.resolve()) for file in files.values()), files
    assert Path(harness).resolve().is_relative_to(REPO_ROOT / "benchmarks")


def test_a_checkout_or_its_tree_of_links_names_the_same_baseline(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path / "old")
    linked = tmp_path / "linked"
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "source_tree.py"), str(checkout), str(linked)],
        check=True,
    )
    assert baseline_checkout(checkout) == checkout.resolve()
    assert baseline_checkout(linked) == checkout.resolve()
    with pytest.raises(ValueError, match="neither spark_client"):
        baseline_checkout(tmp_path)


def test_a_baseline_worker_that_imported_this_checkouts_client_stops_the_report(tmp_path: Path) -> None:
    trees = {"current": REPO_ROOT, "baseline": tmp_path / "old"}
    leaked = str(REPO_ROOT / "spark_client" / "__init__.py")
    imports = [
        ("driver", {"udfserve.spark_client": str(tmp_path / "old" / "spark_client" / "__init__.py")}),
        ("Spark worker 12", {"udfserve.spark_client": leaked}),
    ]
    with pytest.raises(WrongTreeError) as raised:
        check_trees("remote_predict (baseline)", imports, "baseline", trees, client_required=True)
    message = str(raised.value)
    assert "Spark worker 12" in message and leaked in message and str(tmp_path / "old") in message


def test_the_client_file_comes_back_when_every_process_ran_its_own_checkout(tmp_path: Path) -> None:
    baseline = REPO_ROOT / "build" / "old"  # a baseline inside this checkout is still the baseline
    trees = {"current": REPO_ROOT, "baseline": baseline}
    client = str(baseline / "spark_client" / "__init__.py")
    imports = [
        (
            "Spark worker 1",
            {"udfserve": str(baseline / "udfserve" / "__init__.py"), "udfserve.spark_client": client},
        )
    ]
    assert (
        check_trees("remote_predict (baseline)", imports, "baseline", trees, client_required=True) == client
    )
    with pytest.raises(WrongTreeError, match="not the current tree"):
        check_trees("remote_predict", imports, "current", trees, client_required=True)


def test_a_variant_that_needs_the_client_and_imported_none_stops_the_report() -> None:
    trees = {"current": REPO_ROOT}
    assert check_trees("floor", [("Spark worker 1", {})], "current", trees, client_required=False) is None
    with pytest.raises(WrongTreeError, match=r"imported no udfserve\.spark_client"):
        check_trees("remote_predict", [("Spark worker 1", {})], "current", trees, client_required=True)
    outside = {"udfserve.spark_client": "/usr/lib/python3/site-packages/udfserve/spark_client/__init__.py"}
    with pytest.raises(WrongTreeError, match="in neither tree"):
        check_trees("remote_predict", [("Spark worker 1", outside)], "current", trees, client_required=True)

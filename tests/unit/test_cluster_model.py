"""The on-paper cluster model: which limit binds a node, and that every figure it prints has a source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import cluster_model
from benchmarks.cluster_model import ModelCosts, node_estimate
from benchmarks.report import RESULTS_DIR

# 10 µs of executor CPU per row, 1 µs of event loop, a GPU call of 1,000 rows taking 1 ms: each
# executor core then serves 100k rows/s, each server's event loop 1M, each GPU 1M.
FIXED = ModelCosts(
    model="fixed",
    contender="1a fixed",
    jvm_s=6e-6,
    workers_s=4e-6,
    server_s=10e-6,
    event_loop_s=1e-6,
    serving_s=2e-6,
    gpu_call_s={"T4": (1e-3, 5e-4)},
    gpu_call_fp16_s={"T4": 5e-4},
    batch_rows=1000,
    sources=("M1",),
)


def test_few_executor_cores_are_the_bottleneck_of_a_gpu_node() -> None:
    estimate = node_estimate(FIXED, cores=4, gpus=1, gpu="T4")
    assert estimate.bottleneck == "executor cores"
    assert estimate.rows_s == pytest.approx(400_000)


def test_many_executor_cores_on_one_gpu_meet_the_servers_event_loop_first() -> None:
    # the event loop and the GPU allow 1M each; the loop is named (it comes first on a tie)
    estimate = node_estimate(FIXED, cores=64, gpus=1, gpu="T4")
    assert estimate.bottleneck == "server event loop"
    assert estimate.rows_s == pytest.approx(1_000_000)


def test_a_gpu_slower_than_the_event_loop_is_the_bottleneck() -> None:
    slow_gpu = ModelCosts(**{**FIXED.__dict__, "gpu_call_s": {"T4": (4e-3, 2e-3)}})
    estimate = node_estimate(slow_gpu, cores=64, gpus=2, gpu="T4")
    assert estimate.bottleneck == "GPU"
    assert estimate.rows_s == pytest.approx(500_000)


def test_without_a_gpu_the_cpu_server_shares_the_executor_cores() -> None:
    estimate = node_estimate(FIXED, cores=8, gpus=0, gpu="T4")
    assert estimate.gpus_rows_s is None
    assert estimate.rows_s == pytest.approx(8 / 20e-6)
    assert estimate.server_cores_busy == pytest.approx(4.0)


def test_flops_of_the_example_models_follow_the_stated_formula() -> None:
    tabular = sum(cluster_model.layer_flops(x) for x in cluster_model.ARCHITECTURES["tabular_mlp"])
    assert tabular == (2 * 64 * 256 + 256 + 256) + (2 * 256 * 256 + 256 + 256) + (2 * 256 * 8 + 8 + 23)
    sequence = sum(cluster_model.layer_flops(x) for x in cluster_model.ARCHITECTURES["sequence_bilstm"])
    assert sequence == 2 * 16 * (2 * 32 * 128 + 2 * 32 * 128 + 17 * 32) + (2 * 64 * 4 + 4 + 11)


def test_every_row_of_the_node_tables_names_sources_that_are_defined() -> None:
    costs = cluster_model.read_costs(RESULTS_DIR)
    defined = set(
        re.findall(r"^- \*\*([A-Z]\d)\*\*", "\n".join(cluster_model.sources_list(RESULTS_DIR, costs)), re.M)
    )
    tables = [cluster_model.inputs_table(costs), cluster_model.gpu_table(costs)]
    tables += [
        cluster_model.estimates_table(cluster_model.best_contender(candidates), 10, "T4")
        for candidates in costs.values()
    ]
    for table in tables:
        assert table.rows, table.title
        for row in table.rows:
            cited = set(row["sources"].split(", "))
            assert cited and cited <= defined, (table.title, row)


def test_the_node_table_covers_every_core_count_and_gpu_count() -> None:
    costs = cluster_model.read_costs(RESULTS_DIR)
    table = cluster_model.estimates_table(cluster_model.best_contender(costs["tabular_mlp"]), 10, "T4")
    points = {(row["C"], row["G"]) for row in table.rows}
    expected = {(c, g) for c in cluster_model.EXECUTOR_CORES for g in cluster_model.GPUS_PER_NODE}
    assert points == expected


def test_a_results_folder_without_the_measurements_says_which_comparison_to_run(tmp_path: Path) -> None:
    lines = cluster_model.section(tmp_path)
    assert "python -m benchmarks.spark_e2e" in "\n".join(lines)

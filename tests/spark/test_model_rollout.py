"""A Spark job of 1,000,000 rows while the model changes under it: a version published in the
repository (``--model-control poll``), and a version loaded then unloaded by calls
(``--model-control explicit``, tritonclient's ``load_model``).

Every row must be answered exactly once, none by the CPU fallback, each with the predictions of
the version its ``model_version`` column names, and the column must agree with the driver-side
counters. The job's partitions wait at gates the test opens, so the changes are known to happen
while the job runs, and some rows are known to be computed after each change: partitions of the
first stage run ungated, and the change is made while their rows flow; the next stage's
partitions start only once the change serves.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from spark_data import feature_column, feature_values, reference_outputs

from tests.integration.server_harness import metric_value, scrape
from tests.node.node_harness import wait_until
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, remote_predict

logger = logging.getLogger(__name__)

MODEL = "tabular_mlp"
ROWS = 1_000_000
PARTITIONS = 8
DISTINCT_INPUTS = 1000
"""``feature_values`` of id and of id + 1000 are equal: 1,000 distinct rows to check against."""
POLL = ["--model-control", "poll", "--repository-poll-s", "0.2", "--repository-settle-s", "1"]
EXPLICIT = ["--model-control", "explicit"]
SCRAPED_OFTEN = ["--admin-requests-per-s", "1000", "--admin-total-requests-per-s", "1000"]
"""The test reads the rows answered from /metrics between short pauses, above the default limit."""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def expected(example_repository: Path, tabular_version_2: Path) -> dict[int, np.ndarray]:
    """Each version's own probabilities for the 1,000 distinct inputs of the job."""
    inputs = {"features": feature_values(np.arange(DISTINCT_INPUTS), (64,))}
    outputs = {1: reference_outputs(example_repository, MODEL, inputs)["probabilities"]}
    outputs[2] = reference_outputs(tabular_version_2.parent.parent, MODEL, inputs, 2)["probabilities"]
    assert not np.allclose(outputs[1], outputs[2], atol=1e-3), "the two versions must predict differently"
    return outputs


@pytest.fixture
def repository(tabular_onnx_repository: Path, tmp_path: Path) -> Path:
    root = tmp_path / "repository"
    shutil.copytree(tabular_onnx_repository / MODEL, root / MODEL)
    return root


def start_server(repository: Path, tmp_path: Path, control: list[str]) -> ServerProcess:
    return launch_server(
        repository,
        socket=tmp_path / "grpc.sock",
        port=0,
        http_port=0,
        log_path=tmp_path / "server.log",
        extra_args=[*control, *SCRAPED_OFTEN],
    )


class Gates:
    """Files the job's partitions wait for: partition p waits for the gate of its stage."""

    def __init__(self, folder: Path, first_partition_of_stage: list[int]) -> None:
        self.folder = folder
        self.starts = first_partition_of_stage
        folder.mkdir()

    def open(self, stage: int) -> None:
        (self.folder / f"stage-{stage}").touch()

    def gated(self, frame: DataFrame) -> DataFrame:
        folder, starts = str(self.folder), list(self.starts)

        def wait_for_the_gate(batches: Iterator[Any]) -> Iterator[Any]:
            import os
            import time as clock

            from pyspark import TaskContext

            partition = TaskContext.get().partitionId()  # type: ignore[union-attr]
            stage = sum(1 for start in starts if partition >= start)
            while stage and not os.path.exists(os.path.join(folder, f"stage-{stage}")):
                clock.sleep(0.05)
            yield from batches

        return frame.mapInArrow(wait_for_the_gate, frame.schema)


def run_job(
    spark: SparkSession,
    server: ServerProcess,
    repository: Path,
    gates: Gates,
    output: Path,
    consistency: str = "request",
    rows: int = ROWS,
) -> Any:
    """Start the job in a thread: ``rows`` rows through ``remote_predict(with_version=True)``,
    written to ``output`` (read back for the checks, so the UDF runs once per row). Returns the
    UDF (its counters) and the thread. ``consistency``: ``"request"`` (each request the version
    serving when it arrives) or ``"job"`` (the version serving now, for every row)."""
    predict = remote_predict(
        MODEL,
        with_version=True,
        config=ClientConfig(
            address=server.grpc_target(), model_repository=str(repository), version_consistency=consistency
        ),
    )
    frame = gates.gated(spark.range(rows, numPartitions=PARTITIONS))
    scored = frame.select("id", predict(feature_column((64,))).alias("answer"))
    failure: list[BaseException] = []

    def write() -> None:
        try:
            scored.write.parquet(str(output))
        except BaseException as exc:  # reported by the test thread
            failure.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return predict, thread, failure


def rows_answered(server: ServerProcess) -> float:
    return metric_value(scrape(str(server.http_address)), "udfserve_rows_total", model=MODEL)


def when(condition: Callable[[], bool], what: str) -> None:
    wait_until(lambda: condition() or None, 600, what)


def served_versions(server: ServerProcess) -> list[int]:
    import grpc

    with grpc.insecure_channel(server.grpc_target()) as channel:
        metadata = pb_grpc.InferenceStub(channel).GetModelMetadata(
            pb.ModelMetadataRequest(model=MODEL), timeout=60
        )
    return list(metadata.served_versions)


def check_job(
    spark: SparkSession,
    output: Path,
    predict: Any,
    expected: dict[int, np.ndarray],
    rows_expected: int = ROWS,
    fallback_allowed: bool = False,
) -> dict[int, int]:
    """Every row once, none by the fallback (unless ``fallback_allowed``), each with its version's
    predictions; the version column equal to the counters. Returns the rows per version."""
    rows = spark.read.parquet(str(output))
    totals = rows.agg(F.count("*").alias("rows"), F.countDistinct("id").alias("ids")).first()
    assert (totals["rows"], totals["ids"]) == (rows_expected, rows_expected)
    by_version = {
        row["version"]: row["count"]
        for row in rows.groupBy(F.col("answer.model_version").alias("version")).count().collect()
    }
    stats = predict.stats()
    if not fallback_allowed:
        assert stats.rows_by_fallback == 0, stats.fallback_reasons
    assert stats.rows_by_server + stats.rows_by_fallback == rows_expected
    assert stats.rows_by_version == by_version
    reference = spark.createDataFrame(
        [
            (k, version, [float(x) for x in expected[version][k]])
            for version in expected
            for k in range(DISTINCT_INPUTS)
        ],
        "k long, version long, expected array<float>",
    )
    checked = rows.join(
        reference,
        (rows["id"] % DISTINCT_INPUTS == reference["k"])
        & (rows["answer.model_version"] == reference["version"]),
        "left",
    )
    difference = F.array_max(F.zip_with("answer.probabilities", "expected", lambda a, b: F.abs(a - b)))
    result = checked.agg(
        F.count(F.when(F.col("expected").isNull(), 1)).alias("unmatched"), F.max(difference).alias("worst")
    ).first()
    assert result["unmatched"] == 0, "rows answered with a version that is neither 1 nor 2"
    assert result["worst"] < 1e-4, f"a row differs from its version's own prediction by {result['worst']}"
    logger.info(
        "rows per version %s, largest difference to the version's own prediction %.2g",
        by_version,
        result["worst"],
    )
    return by_version


def finish(thread: threading.Thread, failure: list[BaseException]) -> None:
    thread.join(timeout=1800)
    assert not thread.is_alive(), "the job did not finish"
    if failure:
        raise failure[0]


@pytest.mark.timeout(1800)
def test_a_million_row_job_runs_while_a_version_is_published_and_no_row_fails(
    spark: SparkSession,
    repository: Path,
    tabular_onnx_version_2: Path,
    expected: dict[int, np.ndarray],
    tmp_path: Path,
) -> None:
    server = start_server(repository, tmp_path, POLL)
    try:
        gates = Gates(tmp_path / "gates", [4])
        predict, thread, failure = run_job(spark, server, repository, gates, tmp_path / "scored")
        when(lambda: rows_answered(server) >= 300_000, "the third partition's rows flowing")
        publish_version_2(repository, tabular_onnx_version_2)  # published while the first partitions stream
        when(lambda: served_versions(server) == [2], "version 2 serving alone")
        gates.open(1)
        finish(thread, failure)
    finally:
        server.terminate()

    by_version = check_job(spark, tmp_path / "scored", predict, expected)
    assert by_version[1] >= 300_000 and by_version[2] >= ROWS // 2, by_version


@pytest.mark.timeout(1800)
def test_a_million_row_job_runs_while_a_version_is_loaded_and_another_unloaded_by_calls(
    spark: SparkSession,
    repository: Path,
    tabular_onnx_version_2: Path,
    expected: dict[int, np.ndarray],
    tmp_path: Path,
) -> None:
    server = start_server(repository, tmp_path, EXPLICIT)
    config = yaml.safe_load((repository / MODEL / "config.yaml").read_text())
    try:
        gates = Gates(tmp_path / "gates", [3, 6])
        predict, thread, failure = run_job(spark, server, repository, gates, tmp_path / "scored")
        with triton.InferenceServerClient(str(server.tcp_address)) as client:
            when(lambda: rows_answered(server) >= 200_000, "a fifth of the rows answered")
            shutil.copytree(tabular_onnx_version_2, repository / MODEL / "2")  # not served until loaded
            client.load_model(MODEL, client_timeout=600)  # version 2 loads; version 1 drains, unloads
            assert served_versions(server) == [2]
            gates.open(1)
            when(lambda: rows_answered(server) >= 500_000, "half of the rows answered")
            back = {**config, "version_policy": {"specific": [1]}}
            client.load_model(MODEL, config=json.dumps(back), client_timeout=600)
            assert served_versions(server) == [1]  # version 1 loaded again, version 2 unloaded
            gates.open(2)
        finish(thread, failure)
    finally:
        server.terminate()

    by_version = check_job(spark, tmp_path / "scored", predict, expected)
    # version 1: the rows answered before the first load, and the last stage; version 2: at least
    # the rows answered between the loads (the first stage holds 375,000 rows, the second load
    # comes after 500,000)
    assert by_version[1] >= 200_000 + 2 * ROWS // 8 and by_version[2] >= 125_000, by_version


def index_versions(server: ServerProcess) -> set[int]:
    """The versions the server holds ready, leased ones included (its repository index)."""
    import grpc

    from tests.integration.model_control_client import index_states

    with grpc.insecure_channel(server.grpc_target()) as channel:
        states = index_states(pb_grpc.InferenceStub(channel), MODEL)
    return {version for version, state in states.items() if state == "READY"}


LEASE_S = 20.0
LEASED_POLL = [*POLL, "--version-lease-s", str(LEASE_S)]
AFTER_THE_PUBLISH_ROWS = 100_000


@pytest.mark.timeout(1800)
def test_a_job_gets_every_row_from_the_version_it_started_with_while_a_new_one_is_published(
    spark: SparkSession,
    repository: Path,
    tabular_onnx_version_2: Path,
    expected: dict[int, np.ndarray],
    tmp_path: Path,
) -> None:
    """The default, ``version_consistency="job"``: version 1 pinned when the UDF is built, version 2
    published at 30% of the job; a job built after the publish gets version 2; version 1 unloads
    once no job names it for the lease time."""
    server = start_server(repository, tmp_path, LEASED_POLL)
    try:
        gates = Gates(tmp_path / "gates", [4])
        predict, thread, failure = run_job(
            spark, server, repository, gates, tmp_path / "pinned", consistency="job"
        )
        when(lambda: rows_answered(server) >= 300_000, "30% of the job's rows answered")
        publish_version_2(repository, tabular_onnx_version_2)
        when(lambda: served_versions(server) == [2], "version 2 serving requests naming none")
        gates.open(1)
        finish(thread, failure)
        first_job_ended = time.monotonic()
        assert index_versions(server) == {1, 2}  # version 1 leased for the job until its end
        when(lambda: index_versions(server) == {2}, "version 1 unloaded once no job names it")
        unloaded_after_s = time.monotonic() - first_job_ended
        after = Gates(tmp_path / "after-gates", [])
        later, thread, failure = run_job(
            spark,
            server,
            repository,
            after,
            tmp_path / "later",
            consistency="job",
            rows=AFTER_THE_PUBLISH_ROWS,
        )
        finish(thread, failure)
    finally:
        server.terminate()

    assert check_job(spark, tmp_path / "pinned", predict, expected) == {1: ROWS}
    assert predict.stats().pinned_version_switches == 0
    assert check_job(spark, tmp_path / "later", later, expected, AFTER_THE_PUBLISH_ROWS) == {
        2: AFTER_THE_PUBLISH_ROWS
    }
    logger.info(
        "version 1 unloaded %.1f s after the job that pinned it ended (--version-lease-s %g)",
        unloaded_after_s,
        LEASE_S,
    )


@pytest.mark.timeout(1800)
def test_a_pinned_job_keeps_its_version_through_a_server_killed_after_a_publish(
    spark: SparkSession,
    repository: Path,
    tabular_onnx_version_2: Path,
    expected: dict[int, np.ndarray],
    tmp_path: Path,
) -> None:
    """Version 2 published at 30%, then the server SIGKILLed and a new one started on its socket,
    which serves version 2 alone: the job's rows meanwhile go to the CPU fallback, which computes
    the pinned version 1, and the new server loads version 1 for the job when a request names it.
    Every row from version 1."""
    server = start_server(repository, tmp_path, LEASED_POLL)
    replacement: ServerProcess | None = None
    try:
        gates = Gates(tmp_path / "gates", [4])
        predict, thread, failure = run_job(
            spark, server, repository, gates, tmp_path / "scored", consistency="job"
        )
        when(lambda: rows_answered(server) >= 300_000, "30% of the job's rows answered")
        publish_version_2(repository, tabular_onnx_version_2)
        when(lambda: served_versions(server) == [2], "version 2 serving requests naming none")
        server.kill()
        replacement = start_server(repository, tmp_path, LEASED_POLL)
        gates.open(1)
        finish(thread, failure)
    finally:
        server.kill()
        if replacement is not None:
            replacement.terminate()

    by_version = check_job(spark, tmp_path / "scored", predict, expected, fallback_allowed=True)
    stats = predict.stats()
    assert by_version == {1: ROWS}
    assert set(stats.fallback_rows_by_version) <= {1}
    logger.info(
        "rows by the servers %d, by the fallback %d (reasons %s)",
        stats.rows_by_server,
        stats.rows_by_fallback,
        stats.fallback_reasons,
    )


def publish_version_2(repository: Path, tabular_version_2: Path) -> None:
    staging = repository / MODEL / ".2.incoming"
    shutil.copytree(tabular_version_2, staging)
    staging.rename(repository / MODEL / "2")

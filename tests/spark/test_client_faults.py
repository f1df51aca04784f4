"""Faults met by a running Spark job, with real processes: a server drained by SIGTERM, a server
the node supervisor restarts (the client goes back to it, through its unix socket), a server too
slow for the client's deadline.

Each job runs in one partition through ``arrow_predictor`` inside the test's own ``mapInArrow``
function, whose input ``gate`` acts at a given row before the predictor reads it: it signals the
server, then waits for the state the fault leads to (draining, or restarted and ready). That
orders the fault against the job without sleeping. Every test checks by row id that each row is
answered once, with the model's numbers, and reads the client's counters (``stats()``).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from idle_stream import IdleStream
from onnx_graphs import doubled_sum_graph, write_model
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from spark_data import feature_column, feature_values, reference_outputs, stacked

from udfserve.discovery import NodeDiscovery, ServerEntry, read_discovery, write_discovery
from udfserve.services.model_server.launcher import ServerProcess, launch_server
from udfserve.spark_client import ClientConfig, arrow_predictor, remote_predict
from udfserve.spark_client.api.udf import ArrowPredictor
from udfserve.spark_client.executor.circuit import CircuitBreakers
from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.nodes.routing import TaskPlacement
from udfserve.spark_client.observability.stats import ClientStats
from udfserve.spark_client.wire.channels import connect

pytestmark = pytest.mark.slow

# The gate and its actions run in Spark's Python workers, which cannot import this test module:
# ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SLOW_MODEL = Path(__file__).with_name("slow_model.py")
GATE_TIMEOUT_S = 180.0


def gated(predictor: ArrowPredictor, actions: dict[int, object]) -> object:
    """A mapInArrow function: ``actions[row_id]()`` runs when the batch holding that row is read."""

    def run(batches: Iterator[object]) -> Iterator[object]:
        def source() -> Iterator[object]:
            for batch in batches:
                ids = set(batch.column("id").to_pylist())  # type: ignore[attr-defined]
                for row_id, action in actions.items():
                    if row_id in ids:
                        action()  # type: ignore[operator]
                yield batch

        yield from predictor(source())  # type: ignore[arg-type]

    return run


def run_gated(
    spark: SparkSession, rows: int, predictor: ArrowPredictor, actions: dict[int, object]
) -> DataFrame:
    frame = spark.range(rows, numPartitions=1).withColumn("features", feature_column((64,)))
    schema = T.StructType([*frame.schema.fields, *predictor.output_fields()])
    return frame.mapInArrow(gated(predictor, actions), schema).select("id", "probabilities").toPandas()


def check_every_row_once(result: object, rows: int, example_repository: Path) -> None:
    ids = result["id"].to_numpy()  # type: ignore[index]
    assert len(ids) == rows and len(np.unique(ids)) == rows, "a row was lost or answered twice"
    ordered = result.sort_values("id")  # type: ignore[attr-defined]
    expected = reference_outputs(
        example_repository, "tabular_mlp", {"features": feature_values(ordered["id"].to_numpy(), (64,))}
    )["probabilities"]
    np.testing.assert_allclose(stacked(ordered["probabilities"]), expected, atol=1e-5)


def app_sample(http_address: str, metric: str, app_id: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10).read().decode()
    wanted = [f'app_id="{app_id}"', *(f'{k}="{v}"' for k, v in labels.items())]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(metric + "{") and all(w in line for w in wanted)
    )


# -- SIGTERM: the draining server answers what it accepted, the other server the rest ------------


def wait_until_draining(http_address: str) -> None:
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + GATE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://{http_address}/health/ready", timeout=5)
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                return
        time.sleep(0.02)  # a short look between checks of another process's state
    raise AssertionError(f"the server at {http_address} did not start draining")


def test_sigterm_mid_job_the_draining_server_answers_what_it_accepted_and_another_server_the_rest(
    spark: SparkSession,
    server: ServerProcess,
    example_repository: Path,
    tabular_onnx_repository: Path,
    tmp_path: Path,
) -> None:
    rows, sigterm_at = 40_000, 20_000
    draining = launch_server(
        tabular_onnx_repository,
        socket=tmp_path / "draining.sock",
        port=None,
        http_port=0,
        extra_args=["--models", "tabular_mlp", "--grace-period-s", "120"],
        log_path=tmp_path / "draining.log",
    )
    idle = IdleStream(draining.grpc_target())
    try:
        discovery_file = tmp_path / "discovery.json"
        entries = [
            ServerEntry(device="sim:0", device_index=0, unix_socket=draining.unix_socket),
            ServerEntry(device="sim:1", device_index=1, unix_socket=server.unix_socket),
        ]  # partition 0 takes sim:0 first; sim:1 is its alternate
        write_discovery(discovery_file, NodeDiscovery(servers=entries))
        predictor = arrow_predictor(
            "tabular_mlp",
            config=ClientConfig(
                discovery_file=str(discovery_file),
                rows_per_request=2_000,
                fallback="error",
                circuit_reset_s=600,
            ),
        )
        app_id = spark.sparkContext.applicationId
        other_before = app_sample(server.http_address or "", "udfserve_app_rows_total", app_id)
        pid, http_address = draining.pid, draining.http_address or ""

        def sigterm_and_wait_for_the_drain() -> None:
            import os
            import signal

            os.kill(pid, signal.SIGTERM)
            wait_until_draining(http_address)

        result = run_gated(spark, rows, predictor, {sigterm_at: sigterm_and_wait_for_the_drain})
        stats = predictor.stats()
        drained_rows = app_sample(http_address, "udfserve_app_rows_total", app_id)
        refused = app_sample(http_address, "udfserve_app_requests_total", app_id, code="UNAVAILABLE")
    finally:
        idle.close()
        draining.terminate()
    other_rows = app_sample(server.http_address or "", "udfserve_app_rows_total", app_id) - other_before

    check_every_row_once(result, rows, example_repository)
    assert refused > 0, "the draining server refused no batch with UNAVAILABLE"
    assert stats.rows_by_address == {draining.grpc_target(): drained_rows, server.grpc_target(): other_rows}
    assert 0 < drained_rows < rows and drained_rows + other_rows == rows
    assert (stats.rows_by_server, stats.rows_by_fallback) == (rows, 0)
    assert stats.server_failures == {"server_error:UNAVAILABLE": 1}


# -- the node supervisor restarts a killed server: the client goes back to it ------------------


@pytest.fixture
def node(tabular_onnx_repository: Path) -> Iterator[Path]:
    """``udfserve node`` on one simulated device, restarting a dead server after 0.5 s; its
    discovery file. A short runtime folder: unix socket paths are limited to about 100 bytes."""
    runtime_dir = Path(tempfile.mkdtemp(prefix="udfc-"))
    command = [
        sys.executable, "-m", "udfserve", "node",
        "--model-repository", str(tabular_onnx_repository),
        "--devices", "sim:0",
        "--models", "tabular_mlp",
        "--runtime-dir", str(runtime_dir),
        "--supervisor-http-port", "0",
        "--restart-backoff-initial-s", "0.5",
        "--grace-period-s", "5",
    ]  # fmt: skip
    with open(runtime_dir / "supervisor.log", "ab") as log:
        supervisor = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_ready_server(runtime_dir / "discovery.json", other_than=None)
        yield runtime_dir / "discovery.json"
    finally:
        supervisor.terminate()
        supervisor.wait(timeout=60)


def kill_and_await_restart(node: Path, killed_pid: int, kill_at: int, resume_at: int) -> dict[int, object]:
    """Gate actions: SIGKILL the server at row ``kill_at``; at ``resume_at``, wait until the node
    announces the server it started in its place."""

    def kill_server() -> None:
        import os
        import signal

        os.kill(killed_pid, signal.SIGKILL)

    def wait_for_the_restart() -> None:
        wait_for_ready_server(node, other_than=killed_pid)

    return {kill_at: kill_server, resume_at: wait_for_the_restart}


def restarted_server_rows(spark: SparkSession, node: Path) -> tuple[ServerEntry, float]:
    """The node's first server as announced now, and the rows it answered for this application."""
    restarted = read_discovery(node).servers[0]
    rows = app_sample(
        restarted.http_address or "", "udfserve_app_rows_total", spark.sparkContext.applicationId
    )
    return restarted, rows


def wait_for_ready_server(path: Path, other_than: int | None) -> ServerEntry:
    """The node's ready server, once its pid differs from ``other_than``."""
    import time

    from udfserve.discovery import DiscoveryError

    deadline = time.monotonic() + GATE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            ready = read_discovery(path).ready_servers()
        except DiscoveryError:
            ready = []
        if ready and ready[0].pid != other_than:
            return ready[0]
        time.sleep(0.05)  # a short look between checks of a file written by another process
    raise AssertionError(f"no ready server (other than pid {other_than}) in {path}")


def test_a_server_restarted_by_the_node_supervisor_takes_the_partition_back_from_the_cpu(
    spark: SparkSession, node: Path, example_repository: Path, tabular_onnx_repository: Path
) -> None:
    rows, kill_at, resume_at, rows_per_request = 50_000, 10_000, 30_000, 2_000
    killed = read_discovery(node).servers[0]
    assert killed.pid is not None
    predictor = arrow_predictor(
        "tabular_mlp",
        config=ClientConfig(
            discovery_file=str(node),
            rows_per_request=rows_per_request,
            model_repository=str(tabular_onnx_repository),
            circuit_reset_s=0,  # probe at every batch; the delay itself: tests/unit/test_client_circuit.py
        ),
    )
    killed_pid = killed.pid

    result = run_gated(spark, rows, predictor, kill_and_await_restart(node, killed_pid, kill_at, resume_at))
    stats = predictor.stats()
    restarted, restarted_rows = restarted_server_rows(spark, node)

    check_every_row_once(result, rows, example_repository)
    assert restarted.pid != killed_pid
    assert restarted_rows >= rows - resume_at - rows_per_request, "the partition stayed on the CPU"
    assert stats.rows_by_server + stats.rows_by_fallback == rows
    assert stats.rows_by_server >= restarted_rows and stats.batches_by_fallback > 0
    assert sum(stats.fallback_reasons.values()) == stats.batches_by_fallback
    assert set(stats.fallback_reasons) <= {
        "stream_error:UNAVAILABLE",
        "stream_closed",
        "connect_failed",
        "no_server",
    }


def test_a_server_restarted_by_the_node_supervisor_is_dialled_through_its_unix_socket_again(
    spark: SparkSession, node: Path, example_repository: Path, tabular_onnx_repository: Path
) -> None:
    """The killed server's circuits (its socket and its old TCP port) stay open for ten minutes;
    the server announced in its place gets the partition back through the same socket at once,
    not through its new TCP port."""
    rows, kill_at, resume_at, rows_per_request = 40_000, 10_000, 20_000, 2_000
    killed = read_discovery(node).servers[0]
    assert killed.pid is not None and killed.tcp_address is not None
    predictor = arrow_predictor(
        "tabular_mlp",
        config=ClientConfig(
            discovery_file=str(node),
            rows_per_request=rows_per_request,
            model_repository=str(tabular_onnx_repository),
            circuit_reset_s=600,
        ),
    )
    killed_pid = killed.pid

    result = run_gated(spark, rows, predictor, kill_and_await_restart(node, killed_pid, kill_at, resume_at))
    stats = predictor.stats()
    restarted, restarted_rows = restarted_server_rows(spark, node)

    check_every_row_once(result, rows, example_repository)
    assert restarted.pid != killed_pid and restarted.tcp_address != killed.tcp_address
    assert restarted_rows >= rows - resume_at - rows_per_request, "the partition stayed on the CPU"
    assert set(stats.rows_by_address) == {f"unix://{restarted.unix_socket}"}, "a TCP port was dialled"


# -- a server slower than the client's deadline --------------------------------------------------


SLOW_CALL_S = 600.0
"""How long the slow model sleeps in every call: longer than any deadline here, however loaded
the machine. Its servers are killed at the end of the module, asleep."""
DEADLINE_S = 10.0
"""The client's deadline where a fast server must meet it: 1,000 rows of the fast model take
milliseconds idle and well under a second at several times the idle load."""


FAST_CONFIG = """\
max_batch_size: 4096
warmup: false
dynamic_batching:
  max_queue_delay_s: 0.002
"""
"""The slow model's batching settings (``slow_model.py``), for its fast ONNX twin."""


@pytest.fixture(scope="module")
def slow_and_fast_repositories(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same numbers twice: a SavedModel that sleeps ``SLOW_CALL_S`` per call (the sleep is a
    TensorFlow op), and their ONNX graph, fast, which a server and a CPU fallback run without
    importing TensorFlow."""
    root = tmp_path_factory.mktemp("slow-model")
    subprocess.run(
        [sys.executable, str(SLOW_MODEL), str(root / "slow"), "1", str(SLOW_CALL_S)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    write_model(root / "fast", "slow_sum", doubled_sum_graph(), config=FAST_CONFIG)
    return root / "slow", root / "fast"


@pytest.fixture(scope="module")
def slow_server(slow_and_fast_repositories: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    """The slow model's server, on a unix socket and a TCP port, shared by the module's tests:
    each finds it asleep in a call (its first, or an earlier test's), which a deadline misses
    alike."""
    folder = tmp_path_factory.mktemp("slow-server")
    process = launch_server(
        slow_and_fast_repositories[0], socket=folder / "grpc.sock", port=0, http_port=0,
        log_path=folder / "server.log",
    )  # fmt: skip
    yield process
    process.kill()  # a graceful drain would wait for the sleeping call


def test_a_server_slower_than_the_deadline_leaves_the_batch_and_the_rest_to_the_fallback(
    spark: SparkSession, slow_server: ServerProcess, slow_and_fast_repositories: tuple[Path, Path]
) -> None:
    rows, rows_per_request = 6_000, 1_000
    config = ClientConfig(
        address=slow_server.grpc_target(),
        model_repository=str(slow_and_fast_repositories[1]),
        rows_per_request=rows_per_request,
        max_in_flight=1,
        request_timeout_s=2.0,  # missed whatever the load: the model sleeps SLOW_CALL_S
        circuit_reset_s=600,
    )
    predict = remote_predict("slow_sum", config=config)
    result = (
        spark.range(rows, numPartitions=1)
        .select("id", predict(feature_column((4,))).alias("doubled_sum"))
        .toPandas()
        .sort_values("id")
    )
    stats = predict.stats()

    ids = result["id"].to_numpy()
    assert np.array_equal(ids, np.arange(rows))
    expected = 2.0 * feature_values(ids, (4,)).sum(axis=1)
    np.testing.assert_allclose(result["doubled_sum"].to_numpy(), expected, atol=1e-5)
    assert stats.server_failures == {"deadline_exceeded": 1}
    assert (stats.rows_by_server, stats.rows_by_fallback) == (0, rows)
    assert stats.fallback_reasons == {"deadline_exceeded": rows // rows_per_request}


@pytest.fixture(scope="module")
def node_of_a_slow_and_a_fast_server(
    slow_server: ServerProcess,
    slow_and_fast_repositories: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Path]:
    """A discovery file: sim:0 the slow model (unix socket and TCP port), sim:1 the fast one."""
    folder = tmp_path_factory.mktemp("slow-and-fast")
    fast = launch_server(
        slow_and_fast_repositories[1], socket=folder / "fast.sock", port=0, http_port=None,
        log_path=folder / "fast.log",
    )  # fmt: skip
    entries = [
        ServerEntry(device=f"sim:{i}", device_index=i, unix_socket=s.unix_socket, tcp_address=s.tcp_address)
        for i, s in enumerate((slow_server, fast))
    ]
    write_discovery(folder / "discovery.json", NodeDiscovery(servers=entries))
    yield folder / "discovery.json"
    fast.kill()  # no state worth a drain


def test_a_server_that_missed_the_deadline_is_not_tried_again_through_its_tcp_port(
    node_of_a_slow_and_a_fast_server: Path,
) -> None:
    config = ClientConfig(
        discovery_file=str(node_of_a_slow_and_a_fast_server),
        fallback="error",
        rows_per_request=1_000,
        request_timeout_s=DEADLINE_S,
    )
    fast = read_discovery(node_of_a_slow_and_a_fast_server).servers[1]
    _, spec = connect(f"unix://{fast.unix_socket}", config, "slow_sum")
    values = feature_values(np.arange(4_000), (4,))
    batch = pa.RecordBatch.from_arrays(
        [pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 4)], names=["features"]
    )
    stats = ClientStats()
    answers = list(
        predict_partition(
            PredictJob("slow_sum", spec, config), iter([batch]), {}, TaskPlacement(partition_id=0),
            stats=stats, breakers=CircuitBreakers(),
        )
    )  # fmt: skip
    answered = pa.concat_batches(answers).column(0).to_numpy()
    np.testing.assert_allclose(answered, 2.0 * values.sum(axis=1), atol=1e-5)
    assert stats.server_failures == {"deadline_exceeded": 1}  # the unix socket only, not the TCP port too
    assert (stats.rows_by_server, stats.rows_by_fallback) == (4_000, 0)

"""A partition of a job pinned to version 1 while version 2 is published, against a real server that
keeps no old version (``--max-leased-versions 0``): the job fails saying why, or follows the version
serving and counts it, as it asked; and the CPU fallback computes the pinned version after the
policy moved on.

The partition runs in this process (``predict_partition``, as a Spark task runs it), fed by a
generator that publishes version 2 between two batches and waits until the server serves it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
from server_harness import batch_of, running_server

from tests.node.node_harness import wait_until
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.common.errors import ModelNotFound
from udfserve.spark_client.common.versions import VERSION_FIELD
from udfserve.spark_client.executor.circuit import CircuitBreakers
from udfserve.spark_client.executor.fallback import predict_on_cpu
from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.nodes.routing import TaskPlacement
from udfserve.spark_client.observability.stats import ClientStats
from udfserve.spark_client.wire.protocols import describe_model

MODEL = "tabular_mlp"
POLL = ["--model-control", "poll", "--repository-poll-s", "0.2", "--repository-settle-s", "0.5"]
BATCHES_BEFORE = 3
BATCHES_AFTER = 3
ROWS = 256


@pytest.fixture
def repository(tabular_repository: Path) -> Path:
    return tabular_repository


@pytest.fixture
def keeping_none(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    flags = [*POLL, "--max-leased-versions", "0"]
    with running_server(repository, socket_dir, tmp_path_factory, "keeps-none", flags) as server:
        yield server


def served_versions(server: ServerProcess) -> list[int]:
    with grpc.insecure_channel(f"unix://{server.unix_socket}") as channel:
        stub = pb_grpc.InferenceStub(channel)
        return list(stub.GetModelMetadata(pb.ModelMetadataRequest(model=MODEL), timeout=60).served_versions)


def batches(server: ServerProcess, repository: Path, version_2: Path) -> Iterator[pa.RecordBatch]:
    """Batches of the partition; version 2 published, and serving, between two of them."""
    features = np.random.default_rng(5).normal(size=(ROWS, 64)).astype(np.float32)
    for _ in range(BATCHES_BEFORE):
        yield batch_of({"features": features})
    staging = repository / MODEL / ".2.incoming"
    shutil.copytree(version_2, staging)
    staging.rename(repository / MODEL / "2")
    wait_until(lambda: served_versions(server) == [2] or None, 120, "version 2 serving")
    for _ in range(BATCHES_AFTER):
        yield batch_of({"features": features})


def pinned_job(server: ServerProcess, repository: Path, when_gone: str) -> PredictJob:
    target = f"unix://{server.unix_socket}"
    config = ClientConfig(
        address=target,
        model_repository=str(repository),
        when_pinned_version_gone=when_gone,  # type: ignore[arg-type]
        max_in_flight=1,
    )
    spec = describe_model(target, config, MODEL).spec
    assert spec.version == 1
    pinned = config.model_copy(update={"model_version": spec.version}).task_config()
    return PredictJob(MODEL, spec, pinned, with_version=True, version_pinned=True)


def test_a_job_whose_pinned_version_the_server_no_longer_keeps_fails_saying_why(
    keeping_none: ServerProcess, repository: Path, tabular_onnx_version_2: Path
) -> None:
    job = pinned_job(keeping_none, repository, "fail")
    answers = predict_partition(
        job,
        batches(keeping_none, repository, tabular_onnx_version_2),
        {},
        TaskPlacement(),
        breakers=CircuitBreakers(),
    )

    with pytest.raises(ModelNotFound) as refused:
        list(answers)

    assert "version 1 is no longer served" in str(refused.value)
    assert "--max-leased-versions 0" in str(refused.value)


def test_a_job_that_asked_to_follow_goes_on_with_the_version_serving_and_counts_it(
    keeping_none: ServerProcess, repository: Path, tabular_onnx_version_2: Path
) -> None:
    job = pinned_job(keeping_none, repository, "follow")
    stats = ClientStats()

    answers = list(
        predict_partition(
            job,
            batches(keeping_none, repository, tabular_onnx_version_2),
            {},
            TaskPlacement(),
            stats=stats,
            breakers=CircuitBreakers(),
        )
    )

    versions = [answer.column(VERSION_FIELD)[0].as_py() for answer in answers]
    assert len(answers) == BATCHES_BEFORE + BATCHES_AFTER
    assert versions[:BATCHES_BEFORE] == [1] * BATCHES_BEFORE and versions[-1] == 2
    assert stats.pinned_version_switches == 1
    assert sum(stats.rows_by_version.values()) == (BATCHES_BEFORE + BATCHES_AFTER) * ROWS
    assert stats.rows_by_fallback == 0


def test_the_cpu_fallback_computes_the_pinned_version_after_the_policy_moved_on(
    repository: Path, tabular_onnx_version_2: Path
) -> None:
    shutil.copytree(tabular_onnx_version_2, repository / MODEL / "2")  # the policy (latest 1) serves 2
    features = np.random.default_rng(6).normal(size=(8, 64)).astype(np.float32)

    _, pinned = predict_on_cpu(repository, MODEL, 1, batch_of({"features": features}), pinned=True)
    _, newest = predict_on_cpu(repository, MODEL, 0, batch_of({"features": features}))

    assert (pinned, newest) == (1, 2)
    with pytest.raises(ModelNotFound, match="version 1"):
        predict_on_cpu(repository, MODEL, 1, batch_of({"features": features}))

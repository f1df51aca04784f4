"""The errors of a client that finds no server and cannot fall back: each says what is missing once."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from udfserve.spark_client.api.udf import describe_in_driver
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.common.errors import ModelMetadataError, ServerUnavailable
from udfserve.spark_client.common.model_spec import spec_from_tensors
from udfserve.spark_client.executor.circuit import CircuitBreakers
from udfserve.spark_client.executor.partition import PredictJob, predict_partition
from udfserve.spark_client.nodes.routing import ADDRESS_ENV, TaskPlacement


def test_the_driver_says_once_that_there_is_no_discovery_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    missing = tmp_path / "absent.json"
    with pytest.raises(ModelMetadataError) as refused:
        describe_in_driver("tabular_mlp", ClientConfig(discovery_file=str(missing)))
    message = str(refused.value)
    assert message.count(f"no discovery file at {missing}") == 1, message
    assert message.endswith(
        "and the CPU fallback needs the model files: set ClientConfig.model_repository (or "
        "spark.udfserve.modelRepository); the repository a node's discovery file names is used only "
        "with fallback_repository_from_node=True (spark.udfserve.fallbackRepositoryFromNode)"
    )


def test_a_task_says_once_that_there_is_no_discovery_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.json"
    spec = spec_from_tensors("m", 1, [("x", "float32", [])], [("y", "float32", [])])
    job = PredictJob("m", spec, ClientConfig(discovery_file=str(missing)))
    batch = pa.record_batch({"x": pa.array([1.0], pa.float32())})
    with pytest.raises(ServerUnavailable) as refused:
        list(predict_partition(job, iter([batch]), {}, TaskPlacement(), breakers=CircuitBreakers()))
    message = str(refused.value)
    assert message.count(f"no discovery file at {missing}") == 1, message
    assert message.endswith(
        "the CPU fallback cannot run: the CPU fallback needs the model files: set "
        "ClientConfig.model_repository (or spark.udfserve.modelRepository); the repository a node's "
        "discovery file names is used only with fallback_repository_from_node=True "
        "(spark.udfserve.fallbackRepositoryFromNode)"
    )

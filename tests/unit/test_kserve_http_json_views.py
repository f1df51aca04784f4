"""The KServe answers as Triton writes them in JSON, and the HTTP status of each gRPC status."""

from __future__ import annotations

import grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as kpb

from udfserve.services.model_server.frontends.kserve_http.json_views import (
    HTTP_STATUS_OF,
    as_json,
    http_status,
)


def test_64_bit_integers_are_json_numbers_and_defaults_are_written() -> None:
    config = mc.ModelConfig(
        name="m",
        max_batch_size=0,
        input=[mc.ModelInput(name="x", data_type=mc.TYPE_FP32, dims=[-1, 64])],
        dynamic_batching=mc.ModelDynamicBatching(max_queue_delay_microseconds=2000),
    )
    written = as_json(config)
    assert written["max_batch_size"] == 0
    assert written["input"][0]["dims"] == [-1, 64]
    assert written["input"][0]["data_type"] == "TYPE_FP32"
    assert written["dynamic_batching"]["max_queue_delay_microseconds"] == 2000


def test_statistics_counts_nested_in_lists_and_messages_are_numbers() -> None:
    stats = kpb.ModelStatisticsResponse(
        model_stats=[
            kpb.ModelStatistics(
                name="m",
                version="1",
                inference_count=7,
                inference_stats=kpb.InferStatistics(success=kpb.StatisticDuration(count=3, ns=12345)),
                batch_stats=[
                    kpb.InferBatchStatistics(batch_size=4, compute_infer=kpb.StatisticDuration(count=1))
                ],
            )
        ]
    )
    (model,) = as_json(stats)["model_stats"]
    assert model["inference_count"] == 7
    assert model["inference_stats"]["success"] == {"count": 3, "ns": 12345}
    assert model["batch_stats"][0]["batch_size"] == 4
    assert model["batch_stats"][0]["compute_infer"]["count"] == 1


def test_model_metadata_shapes_are_numbers_with_the_free_batch_dimension() -> None:
    metadata = kpb.ModelMetadataResponse(
        name="m",
        versions=["1"],
        inputs=[kpb.ModelMetadataResponse.TensorMetadata(name="x", datatype="FP32", shape=[-1, 64])],
    )
    assert as_json(metadata)["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]


def test_statuses_map_as_triton_maps_them_and_the_rest_as_google_s_http_mapping() -> None:
    assert http_status(grpc.StatusCode.INVALID_ARGUMENT) == 400
    assert http_status(grpc.StatusCode.NOT_FOUND) == 404
    assert http_status(grpc.StatusCode.UNAVAILABLE) == 503  # a full queue, as Triton answers it
    assert http_status(grpc.StatusCode.UNIMPLEMENTED) == 501
    assert http_status(grpc.StatusCode.INTERNAL) == 500
    assert http_status(grpc.StatusCode.RESOURCE_EXHAUSTED) == 429
    assert http_status(grpc.StatusCode.FAILED_PRECONDITION) == 400
    assert http_status(grpc.StatusCode.DEADLINE_EXCEEDED) == 504
    assert set(HTTP_STATUS_OF) == set(grpc.StatusCode)

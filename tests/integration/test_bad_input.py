"""Bad input gets a status that means what gRPC says, a message naming expected and received,
and the server keeps serving everyone else."""

from __future__ import annotations

import grpc
import numpy as np
import pyarrow as pa
import pytest
from server_harness import batch_of, metric_value, request, scrape, stream_predict

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol.arrow_ipc import encode_batch
from udfserve.services.model_server.launcher import ServerProcess

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def features(rows: int, width: int = 64) -> np.ndarray:
    return np.random.default_rng(rows).normal(size=(rows, width)).astype(np.float32)


def answer_to(server: ServerProcess, model: str, payload: pa.RecordBatch | bytes, version: int = 0):
    return stream_predict(f"unix://{server.unix_socket}", [request(model, payload, version=version)])[0]


def assert_still_serving(server: ServerProcess) -> None:
    answer = answer_to(server, "tabular_mlp", batch_of({"features": features(3)}))
    assert answer.code == grpc.StatusCode.OK and answer.outputs is not None
    assert answer.outputs.num_rows == 3


def test_unknown_model_is_not_found_and_lists_the_available_models(server: ServerProcess) -> None:
    answer = answer_to(server, "no_such_model", batch_of({"features": features(2)}))
    assert answer.code == grpc.StatusCode.NOT_FOUND
    assert "no_such_model" in answer.message and "tabular_mlp" in answer.message
    assert_still_serving(server)


def test_unknown_version_is_not_found_and_names_the_served_version(server: ServerProcess) -> None:
    answer = answer_to(server, "tabular_mlp", batch_of({"features": features(2)}), version=7)
    assert answer.code == grpc.StatusCode.NOT_FOUND
    assert "version 7" in answer.message and "serves version 1" in answer.message


@pytest.mark.parametrize("name", ["../tabular_mlp", "a/b", "..", "/etc/passwd", "x\\y"])
def test_model_name_with_a_path_separator_or_dotdot_is_invalid(server: ServerProcess, name: str) -> None:
    answer = answer_to(server, name, batch_of({"features": features(2)}))
    assert answer.code == INVALID
    assert "invalid model name" in answer.message


def test_missing_input_column_names_the_expected_and_the_received_columns(server: ServerProcess) -> None:
    answer = answer_to(server, "tabular_mlp", batch_of({"feature": features(2)}))
    assert answer.code == INVALID
    assert "'features'" in answer.message and "feature" in answer.message
    assert_still_serving(server)


def test_extra_columns_are_refused_by_name(server: ServerProcess) -> None:
    batch = batch_of({"features": features(2), "row_id": np.arange(2)})
    answer = answer_to(server, "tabular_mlp", batch)
    assert answer.code == INVALID
    assert "row_id" in answer.message


def test_float64_columns_are_accepted_for_float32_inputs(server: ServerProcess) -> None:
    answer = answer_to(server, "tabular_mlp", batch_of({"features": features(4).astype(np.float64)}))
    assert answer.code == grpc.StatusCode.OK
    assert answer.outputs is not None and answer.outputs.num_rows == 4


def test_a_string_column_is_refused_naming_the_expected_dtype(server: ServerProcess) -> None:
    batch = pa.record_batch({"features": pa.array([["a"] * 64, ["b"] * 64])})
    answer = answer_to(server, "tabular_mlp", batch)
    assert answer.code == INVALID
    assert "features" in answer.message and "float32" in answer.message and "string" in answer.message


def test_a_float_column_for_an_integer_input_is_refused(server: ServerProcess) -> None:
    batch = batch_of({"numeric": features(2, 8), "category": np.array([1.5, 2.0])})
    answer = answer_to(server, "multi_io", batch)
    assert answer.code == INVALID
    assert "category" in answer.message and "int32" in answer.message


def test_a_list_of_the_wrong_inner_length_names_expected_and_received_lengths(server: ServerProcess) -> None:
    answer = answer_to(server, "tabular_mlp", batch_of({"features": features(3, width=63)}))
    assert answer.code == INVALID
    assert "features" in answer.message and "64" in answer.message and "63" in answer.message


def test_ragged_lists_name_the_first_bad_row(server: ServerProcess) -> None:
    rows = [list(np.ones(64)), list(np.ones(64)), list(np.ones(10))]
    answer = answer_to(
        server, "tabular_mlp", pa.record_batch({"features": pa.array(rows, pa.list_(pa.float32()))})
    )
    assert answer.code == INVALID
    assert "features" in answer.message and "row 2" in answer.message


def test_nulls_are_refused_naming_the_column_and_row(server: ServerProcess) -> None:
    rows = [list(np.ones(64)), None]
    answer = answer_to(
        server, "tabular_mlp", pa.record_batch({"features": pa.array(rows, pa.list_(pa.float32()))})
    )
    assert answer.code == INVALID
    assert "features" in answer.message and "null" in answer.message and "row 1" in answer.message


def test_nan_and_inf_pass_through_without_error(server: ServerProcess) -> None:
    values = features(3)
    values[0, 0], values[1, 1] = np.nan, np.inf
    answer = answer_to(server, "tabular_mlp", batch_of({"features": values}))
    assert answer.code == grpc.StatusCode.OK and answer.outputs is not None
    assert answer.outputs.num_rows == 3


def test_an_empty_batch_gets_an_empty_answer_with_the_output_schema(server: ServerProcess) -> None:
    answer = answer_to(server, "tabular_mlp", batch_of({"features": features(0)}))
    assert answer.code == grpc.StatusCode.OK and answer.outputs is not None
    assert answer.outputs.num_rows == 0
    assert answer.outputs.schema.names == ["probabilities"]


@pytest.mark.parametrize("cut", ["garbage", "truncated", "empty"])
def test_corrupt_or_truncated_arrow_bytes_are_invalid(server: ServerProcess, cut: str) -> None:
    payload = encode_batch(batch_of({"features": features(5)}))
    corrupt = {"garbage": b"\x00not arrow at all", "truncated": payload[: len(payload) // 2], "empty": b""}[
        cut
    ]
    answer = answer_to(server, "tabular_mlp", corrupt)
    assert answer.code == INVALID
    assert "Arrow IPC" in answer.message
    assert_still_serving(server)


def test_a_message_over_the_size_limit_is_resource_exhausted(
    example_repository, socket_dir, tmp_path
) -> None:
    from udfserve.services.model_server.launcher import launch_server

    small = launch_server(
        example_repository,
        socket=socket_dir / "small.sock",
        http_port=None,
        extra_args=["--max-message-bytes", "1000000", "--models", "tabular_mlp"],
        log_path=tmp_path / "server.log",
    )
    try:
        big = request("tabular_mlp", batch_of({"features": features(8000)}))  # about 2 MB
        with pytest.raises(grpc.RpcError) as raised:
            stream_predict(small.grpc_target(), [big])
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        answer = stream_predict(
            small.grpc_target(), [request("tabular_mlp", batch_of({"features": features(5)}))]
        )
        assert answer[0].code == grpc.StatusCode.OK
    finally:
        assert small.terminate() == 0


def test_a_bad_batch_among_good_ones_on_concurrent_streams_fails_alone(server: ServerProcess) -> None:
    good = [request("tabular_mlp", batch_of({"features": features(5 + i)}), batch_id=i) for i in range(30)]
    bad = request("tabular_mlp", batch_of({"features": features(5, width=3)}), batch_id=99)
    answers = stream_predict(f"unix://{server.unix_socket}", [*good[:15], bad, *good[15:]])
    assert answers[99].code == INVALID
    for i in range(30):
        assert answers[i].code == grpc.StatusCode.OK and answers[i].outputs is not None
        assert answers[i].outputs.num_rows == 5 + i


INT32 = np.iinfo(np.int32)


def multi_io_batch(categories: list[int]) -> pa.RecordBatch:
    return batch_of({"numeric": features(len(categories), 8), "category": np.array(categories, np.int32)})


@pytest.mark.parametrize("category", [99, 1000, INT32.max, INT32.min])
def test_an_id_beyond_the_embedding_table_is_invalid_naming_the_input_and_the_row(
    server: ServerProcess, category: int
) -> None:
    answer = answer_to(server, "multi_io", multi_io_batch([3, 4, category]))
    assert answer.code == INVALID
    assert "'category'" in answer.message and "row 2" in answer.message and "[0, 15]" in answer.message
    assert "File " not in answer.message and "Traceback" not in answer.message
    assert_still_serving(server)


def test_ids_beyond_the_embedding_table_never_reach_a_backend_call(server: ServerProcess) -> None:
    """Refused before merging: a bad id can no longer fail a call it shares with other clients."""
    assert server.http_address is not None
    calls = "udfserve_batch_size_rows_count"
    before = metric_value(scrape(server.http_address), calls, model="multi_io")
    bad = [request("multi_io", multi_io_batch([1, 99 + i]), batch_id=i) for i in range(20)]
    answers = stream_predict(f"unix://{server.unix_socket}", bad)
    assert {answer.code for answer in answers.values()} == {INVALID}
    assert metric_value(scrape(server.http_address), calls, model="multi_io") == before


def test_good_requests_streamed_between_bad_ids_are_all_answered(server: ServerProcess) -> None:
    good = [request("multi_io", multi_io_batch([i % 16] * 4), batch_id=i) for i in range(20)]
    bad = [request("multi_io", multi_io_batch([1, 1000]), batch_id=100 + i) for i in range(20)]
    interleaved = [message for pair in zip(good, bad, strict=True) for message in pair]
    answers = stream_predict(f"unix://{server.unix_socket}", interleaved)
    assert all(answers[i].code == grpc.StatusCode.OK for i in range(20))
    assert all(answers[100 + i].code == INVALID for i in range(20))


def test_a_predict_message_that_does_not_parse_ends_the_stream_invalid(server: ServerProcess) -> None:
    good = request("tabular_mlp", batch_of({"features": features(2)}), batch_id=1).SerializeToString()
    with grpc.insecure_channel(f"unix://{server.unix_socket}") as channel:
        stream = channel.stream_stream(
            "/udfserve.v1.Inference/Predict", response_deserializer=pb.PredictResponse.FromString
        )(iter([good, b"\x0a\x05ab"]), timeout=60)
        answers = []
        with pytest.raises(grpc.RpcError) as raised:
            answers.extend(stream)
    assert raised.value.code() == INVALID
    assert "cannot be parsed as udfserve.v1.PredictRequest" in (raised.value.details() or "")
    assert [answer.batch_id for answer in answers] == [1]


@pytest.mark.parametrize("method", ["Check", "Watch"])
def test_a_health_message_that_does_not_parse_is_invalid_argument(server: ServerProcess, method: str) -> None:
    with grpc.insecure_channel(f"unix://{server.unix_socket}") as channel:
        path = f"/grpc.health.v1.Health/{method}"
        call = channel.unary_unary(path) if method == "Check" else channel.unary_stream(path)
        with pytest.raises(grpc.RpcError) as raised:
            answer = call(b"\x0a\x05ab", timeout=60)
            if method == "Watch":
                list(answer)
    assert raised.value.code() == INVALID
    assert "cannot be parsed as grpc.health.v1.HealthCheckRequest" in (raised.value.details() or "")

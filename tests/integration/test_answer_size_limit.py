"""An answer that cannot fit the message limit is refused before the model runs, naming the size."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from server_harness import batch_of, metric_value, module_server, scrape
from test_shared_memory import MODEL, PayloadFile, features, raw_predict

from udfserve.protocol import inference_pb2 as pb
from udfserve.services.model_server.launcher import ServerProcess

MAX_MESSAGE_BYTES = 1 << 16  # the smallest the server accepts
ROWS = 3_000  # 8 float32 outputs per row: 96,000 bytes of values, over the limit


small_messages = module_server(
    "small-messages",
    ["--models", MODEL, "--max-message-bytes", str(MAX_MESSAGE_BYTES)],
    repository="tabular_onnx_repository",
    port=None,
    http_port=0,
)


@pytest.fixture
def large_batch() -> Iterator[PayloadFile]:
    made = PayloadFile(batch_of({"features": features(ROWS)}), output_room=1 << 20)
    yield made
    made.remove()


def backend_calls(server: ServerProcess) -> float:
    return metric_value(scrape(server.http_address or ""), "udfserve_batch_size_rows_count", model=MODEL)


def test_an_answer_over_the_message_limit_is_refused_before_any_backend_call(
    small_messages: ServerProcess, large_batch: PayloadFile
) -> None:
    calls_before = backend_calls(small_messages)
    request = pb.PredictRequest(model=MODEL, batch_id=1, input_region=large_batch.input)

    [response] = raw_predict(f"unix://{small_messages.unix_socket}", [request])

    assert response.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert f"the answer to {ROWS} rows would be at least 96000 bytes" in response.error.message
    assert "send fewer rows per request" in response.error.message
    assert backend_calls(small_messages) == calls_before


def test_the_same_answer_is_served_into_an_output_region_with_room_for_it(
    small_messages: ServerProcess, large_batch: PayloadFile
) -> None:
    request = pb.PredictRequest(
        model=MODEL, batch_id=1, input_region=large_batch.input, output_region=large_batch.output
    )

    [response] = raw_predict(f"unix://{small_messages.unix_socket}", [request])

    assert not response.HasField("error"), response.error.message
    answer = large_batch.answer(response)
    assert answer.num_rows == ROWS
    assert np.isfinite(np.asarray(answer.column(0).flatten())).all()

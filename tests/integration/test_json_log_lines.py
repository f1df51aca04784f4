"""A real server started with ``--log-format json``: its whole log is JSON objects, one a line, and
the lines about a request carry the request's, its model's and its Spark application's ids.

``--slow-request-s`` is set so low that every answered request is logged as slow: a line written
while the answer is made, as a refusal's is written while the refusal is made. Both are written
before the answer leaves the server, so the test reads the log once it has its answer.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import numpy as np
from server_harness import batch_of, module_server, request

from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess

server = module_server(
    "jsonlog", ["--log-format", "json", "--models", "multi_io", "--slow-request-s", "1e-9"]
)

APPLICATION = "app-20261128044000-0007"
SPARK_JOB = (("udfserve-spark-app-id", APPLICATION), ("udfserve-spark-app-name", "json log check"))


def log_lines(server: ServerProcess) -> list[dict[str, Any]]:
    """Every line of the server's log, each read as one JSON object (a line that is not one fails)."""
    assert server.log_path is not None
    return [json.loads(line) for line in server.log_path.read_text().splitlines()]


def predict(server: ServerProcess, batch_id: int, categories: list[int]) -> None:
    rows = len(categories)
    inputs = batch_of(
        {"numeric": np.zeros((rows, 8), np.float32), "category": np.array(categories, np.int32)}
    )
    with grpc.insecure_channel(server.grpc_target()) as channel:
        stub = pb_grpc.InferenceStub(channel)
        list(stub.Predict(iter([request("multi_io", inputs, batch_id)]), timeout=60, metadata=SPARK_JOB))


def test_every_line_of_the_servers_log_is_a_json_object_with_time_level_logger_and_message(
    server: ServerProcess,
) -> None:
    lines = log_lines(server)

    assert any(line["message"].startswith("model 'multi_io' version") for line in lines), lines
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)


def test_the_line_of_an_answered_request_carries_its_request_model_and_application_ids(
    server: ServerProcess,
) -> None:
    predict(server, 41, [1, 2])

    [line] = [line for line in log_lines(server) if line.get("request_id") == "41"]
    assert line["message"].startswith("slow request: model=multi_io batch_id=41 code=OK")
    assert (line["model"], line["app_id"]) == ("multi_io", APPLICATION)


def test_the_line_of_a_refused_request_carries_its_request_model_and_application_ids(
    server: ServerProcess,
) -> None:
    predict(server, 42, [1, 1000])  # a category beyond the embedding table: INVALID_ARGUMENT

    [line] = [line for line in log_lines(server) if line.get("request_id") == "42"]
    assert line["message"].startswith("failed request: model=multi_io batch_id=42 code=INVALID_ARGUMENT")
    assert (line["model"], line["app_id"]) == ("multi_io", APPLICATION)


def test_the_lines_of_a_model_load_carry_the_model(server: ServerProcess) -> None:
    [ready] = [line for line in log_lines(server) if line["message"].startswith("model 'multi_io' version")]

    assert ready["model"] == "multi_io"

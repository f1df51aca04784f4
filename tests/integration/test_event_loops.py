"""A server runs on uvloop by default and on asyncio's own loop on request, and answers alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.grpc as triton
from server_harness import keras_reference, metric_value, module_server, scrape
from test_predictions import example_inputs, predict_over

from udfserve.services.model_server.launcher import ServerProcess

asyncio_server = module_server(
    "asyncio_loop", ["--event-loop", "asyncio"], repository="tabular_onnx_repository", port=0, http_port=0
)


def test_the_default_server_runs_on_uvloop(server: ServerProcess) -> None:
    assert metric_value(scrape(server.http_address or ""), "udfserve_server_info", event_loop="uvloop") == 1


def test_a_server_asked_for_asyncio_reports_asyncio(asyncio_server: ServerProcess) -> None:
    assert (
        metric_value(scrape(asyncio_server.http_address or ""), "udfserve_server_info", event_loop="asyncio")
        == 1
    )


def test_the_asyncio_loop_answers_arrow_requests_as_the_model_computes(
    asyncio_server: ServerProcess, example_repository: Path
) -> None:
    inputs = example_inputs("tabular_mlp", 300, seed=3)
    got = predict_over(f"unix://{asyncio_server.unix_socket}", "tabular_mlp", inputs)
    for name, values in keras_reference(example_repository, "tabular_mlp", inputs).items():
        np.testing.assert_allclose(got[name], values, atol=1e-5, rtol=1e-5)


def test_the_asyncio_loop_answers_kserve_requests(
    asyncio_server: ServerProcess, example_repository: Path
) -> None:
    features = example_inputs("tabular_mlp", 5, seed=4)["features"]
    with triton.InferenceServerClient(asyncio_server.tcp_address or "") as client:
        tensor = triton.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features)
        result = client.infer("tabular_mlp", [tensor])
    for name, values in keras_reference(example_repository, "tabular_mlp", {"features": features}).items():
        np.testing.assert_allclose(result.as_numpy(name), values, atol=1e-5, rtol=1e-5)

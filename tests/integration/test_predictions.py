"""A real server process answers exactly what the model computes in-process."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
from server_harness import batch_of, column_to_numpy, keras_reference, request, stream_predict

from udfserve.services.model_server.launcher import ServerProcess

MAX_BATCH = {"tabular_mlp": 1024, "sequence_bilstm": 4096, "multi_io": 512, "text_hashing": 1024}


def example_inputs(model: str, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if model == "tabular_mlp":
        return {"features": rng.normal(size=(rows, 64)).astype(np.float32)}
    if model == "sequence_bilstm":
        return {"lines": rng.normal(size=(rows, 16, 32)).astype(np.float32)}
    if model == "text_hashing":
        words = [f"row {index} of the text column".encode() for index in rng.integers(0, 5000, size=rows)]
        return {"text": np.array(words, dtype=object)}
    return {
        "numeric": rng.normal(size=(rows, 8)).astype(np.float32),
        "category": rng.integers(0, 16, size=rows).astype(np.int32),
    }


def predict_over(target: str, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    answer = stream_predict(target, [request(model, batch_of(inputs))])[0]
    assert answer.outputs is not None, answer.message
    return {name: column_to_numpy(answer.outputs.column(name)) for name in answer.outputs.schema.names}


@pytest.mark.parametrize("model", sorted(MAX_BATCH))
@pytest.mark.parametrize("size", ["1", "7", "max", "3xmax"])
def test_predictions_over_the_unix_socket_equal_the_models_own_output(
    server: ServerProcess, example_repository: Path, model: str, size: str
) -> None:
    rows = {"1": 1, "7": 7, "max": MAX_BATCH[model], "3xmax": 3 * MAX_BATCH[model]}[size]
    inputs = example_inputs(model, rows)
    got = predict_over(f"unix://{server.unix_socket}", model, inputs)
    expected = keras_reference(example_repository, model, inputs)
    assert set(got) == set(expected)
    for name, values in expected.items():
        assert got[name].shape == values.shape
        np.testing.assert_allclose(got[name], values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", sorted(MAX_BATCH))
def test_predictions_over_tcp_equal_the_models_own_output(
    server: ServerProcess, example_repository: Path, model: str
) -> None:
    inputs = example_inputs(model, 7, seed=1)
    got = predict_over(server.tcp_address or "", model, inputs)
    for name, values in keras_reference(example_repository, model, inputs).items():
        np.testing.assert_allclose(got[name], values, atol=1e-5, rtol=1e-5)


def test_a_savedmodel_answers_like_the_keras_file_it_was_exported_from(
    server: ServerProcess, example_repository: Path
) -> None:
    inputs = example_inputs("tabular_mlp", 1024 * 3 + 5, seed=2)
    got = predict_over(f"unix://{server.unix_socket}", "tabular_mlp_savedmodel", inputs)
    expected = keras_reference(example_repository, "tabular_mlp", inputs)
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], atol=1e-5, rtol=1e-5)


def test_answers_on_one_stream_are_paired_with_their_batch_ids(server: ServerProcess) -> None:
    batches = {batch_id: example_inputs("tabular_mlp", 3 + batch_id, seed=batch_id) for batch_id in range(20)}
    answers = stream_predict(
        f"unix://{server.unix_socket}",
        [request("tabular_mlp", batch_of(inputs), batch_id=i) for i, inputs in batches.items()],
    )
    assert sorted(answers) == sorted(batches)
    for batch_id, inputs in batches.items():
        outputs = answers[batch_id].outputs
        assert outputs is not None
        assert outputs.num_rows == len(inputs["features"])


def test_a_spark_string_column_is_answered_like_its_utf8_bytes(
    server: ServerProcess, example_repository: Path
) -> None:
    texts = ["héllo wörld", "", "naïve café", "spark"]
    column = pa.array(texts, pa.string())
    answer = stream_predict(
        f"unix://{server.unix_socket}", [request("text_hashing", pa.record_batch({"text": column}))]
    )
    outputs = answer[0].outputs
    assert outputs is not None, answer[0].message
    expected = keras_reference(
        example_repository, "text_hashing", {"text": np.array([t.encode() for t in texts], dtype=object)}
    )
    got = column_to_numpy(outputs.column("probabilities"))
    np.testing.assert_allclose(got, expected["probabilities"], atol=1e-5, rtol=1e-5)


def test_a_null_text_is_refused_naming_the_column_and_the_row(server: ServerProcess) -> None:
    column = pa.array(["a", None], pa.string())
    answer = stream_predict(
        f"unix://{server.unix_socket}", [request("text_hashing", pa.record_batch({"text": column}))]
    )
    assert answer[0].outputs is None and answer[0].code == grpc.StatusCode.INVALID_ARGUMENT
    assert "column 'text'" in answer[0].message and "null row 1" in answer[0].message

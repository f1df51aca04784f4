"""A small real gRPC client and helpers the integration tests share."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import decode_batch, encode_batch
from udfserve.services.model_server.launcher import ServerProcess, launch_server


@contextmanager
def running_server(
    repository: Path,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    extra_args: Sequence[str] = (),
    **launch: Any,
) -> Iterator[ServerProcess]:
    """A server of ``repository`` on ``socket_dir/<name>.sock`` with its log in a temporary folder
    of its own, stopped on exit; ``launch`` goes to ``launch_server`` (ports, environment)."""
    process = launch_server(
        repository,
        socket=socket_dir / f"{name}.sock",
        extra_args=list(extra_args),
        log_path=tmp_path_factory.mktemp(name) / "server.log",
        **launch,
    )
    try:
        yield process
    finally:
        process.terminate()


@contextmanager
def running_server_without(
    modules: Sequence[str],
    repository: Path,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    extra_args: Sequence[str] = (),
) -> Iterator[ServerProcess]:
    """A server whose Python cannot import ``modules``, as where their extra is not installed (or,
    for a compiled module, where it was not built); ``extra_args`` are its own flags.

    A second environment without them would be a copy of several GB made for one test; instead a
    ``sitecustomize`` module, which Python imports at start-up from the first folder of
    ``PYTHONPATH`` holding one, puts ``None`` into ``sys.modules`` for each: Python's own way of
    making a module unimportable (``import`` raises ImportError, ``importlib.util.find_spec``
    answers None), exactly what a process without the package sees, before any server code runs.
    """
    blocker_dir = tmp_path_factory.mktemp(f"{name}-imports")
    lines = ["import sys", *(f"sys.modules[{module!r}] = None" for module in modules)]
    (blocker_dir / "sitecustomize.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(blocker_dir), os.environ.get("PYTHONPATH", "")]))
    with running_server(
        repository, socket_dir, tmp_path_factory, name, extra_args, env={**os.environ, "PYTHONPATH": path}
    ) as process:
        yield process


def module_server(
    name: str, extra_args: Sequence[str] = (), repository: str = "example_repository", **launch: Any
) -> Any:
    """A module-scoped fixture of a server with flags of its own, of the repository the session
    fixture ``repository`` names: the example models, or ``tabular_onnx_repository`` where the
    module tests the server around a model rather than TensorFlow (a start without its import)."""

    @pytest.fixture(scope="module")
    def fixture(
        request: pytest.FixtureRequest, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ServerProcess]:
        models = request.getfixturevalue(repository)
        with running_server(models, socket_dir, tmp_path_factory, name, extra_args, **launch) as process:
            yield process

    return fixture


@dataclass
class Answer:
    """One PredictResponse, decoded."""

    batch_id: int
    outputs: pa.RecordBatch | None
    code: grpc.StatusCode
    message: str


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def stream_predict(
    target: str, requests: Sequence[pb.PredictRequest], timeout_s: float = 120.0
) -> dict[int, Answer]:
    """Send ``requests`` on one Predict stream; return every answer by batch id."""
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceStub(channel)
        answers = {}
        for response in stub.Predict(iter(requests), timeout=timeout_s):
            if response.HasField("error"):
                answers[response.batch_id] = Answer(
                    response.batch_id, None, _CODES[response.error.code], response.error.message
                )
            else:
                answers[response.batch_id] = Answer(
                    response.batch_id, decode_batch(response.arrow_ipc), grpc.StatusCode.OK, ""
                )
        return answers


def request(
    model: str, batch: pa.RecordBatch | bytes, batch_id: int = 0, version: int = 0
) -> pb.PredictRequest:
    payload = batch if isinstance(batch, bytes) else encode_batch(batch)
    return pb.PredictRequest(model=model, batch_id=batch_id, arrow_ipc=payload, version=version)


def tensor_column(values: np.ndarray) -> pa.Array:
    """A (rows, *shape) array as the Arrow column Spark would send: nested lists, or primitives."""
    if values.ndim == 1:
        return pa.array(values)
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat


def batch_of(inputs: dict[str, np.ndarray]) -> pa.RecordBatch:
    return pa.record_batch({name: tensor_column(values) for name, values in inputs.items()})


def column_to_numpy(column: pa.Array) -> np.ndarray:
    """Inverse of ``tensor_column`` for fixed-size lists."""
    shape = []
    values = column
    while pa.types.is_fixed_size_list(values.type):
        shape.append(values.type.list_size)
        values = values.flatten()
    return values.to_numpy(zero_copy_only=False).reshape(len(column), *shape)


def scrape(http_address: str) -> str:
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10) as response:
        return response.read().decode()


def http_json(http_address: str, path: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(f"http://{http_address}{path}", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text exposition (0 when absent)."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        if wanted <= set(label_text.rstrip("}").split(",")) - {""}:
            total += float(value)
    return total


def wait_until_idle(http_address: str, timeout_s: float = 120.0) -> None:
    """Until the server holds no request: none in flight, no row queued in any batcher. A request
    its client abandoned leaves both at once, a batch already running may still finish after."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = scrape(http_address)
        held = metric_value(text, "udfserve_requests_in_flight") + metric_value(text, "udfserve_queued_rows")
        if held == 0:
            return
        time.sleep(0.05)  # a short look between scrapes of another process's state
    raise AssertionError(f"the server at {http_address} still held requests after {timeout_s:g} s")


def wait_for_a_running_call(http_address: str, timeout_s: float = 120.0) -> None:
    """Until the server holds a request that is no longer queued: its model call runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = scrape(http_address)
        if (
            metric_value(text, "udfserve_requests_in_flight") >= 1
            and metric_value(text, "udfserve_queued_rows") == 0
        ):
            return
        time.sleep(0.05)  # a short look between scrapes of another process's state
    raise AssertionError(f"no model call started at {http_address} within {timeout_s:g} s")


_KERAS_MODELS: dict[Path, Any] = {}
"""Loaded Keras models by file: keras ships no type stubs, so they are typed as Any."""


def keras_reference(repository: Path, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's own output in this process, by output name: the ground truth of the tests."""
    import keras

    path = repository / model / "1" / "model.keras"
    if path not in _KERAS_MODELS:
        _KERAS_MODELS[path] = keras.saving.load_model(path, compile=False)
    keras_model = _KERAS_MODELS[path]
    names = [t.name for t in keras_model.inputs]
    feed = {n: inputs[n] for n in names} if len(names) > 1 else inputs[names[0]]
    result = keras_model(feed, training=False)
    output_names = list(keras_model.output_names)
    if isinstance(result, dict):
        return {k: np.asarray(v) for k, v in result.items()}
    if isinstance(result, list | tuple):
        return {n: np.asarray(v) for n, v in zip(output_names, result, strict=True)}
    return {output_names[0]: np.asarray(result)}


def client_process_main(target: str, model: str, seed: int, batches: int, rows: int) -> dict[int, np.ndarray]:
    """Run in a separate client process: stream ``batches`` of seeded rows, return outputs by batch id."""
    rng = np.random.default_rng(seed)
    inputs = {i: rng.normal(size=(rows + i, 64)).astype(np.float32) for i in range(batches)}
    answers = stream_predict(
        target, [request(model, batch_of({"features": x}), batch_id=i) for i, x in inputs.items()]
    )
    outputs = {}
    for batch_id, answer in answers.items():
        if answer.outputs is None:
            raise RuntimeError(f"batch {batch_id} failed: {answer.code.name} {answer.message}")
        outputs[batch_id] = column_to_numpy(answer.outputs.column("probabilities"))
    return outputs


def client_inputs(seed: int, batches: int, rows: int) -> dict[int, np.ndarray]:
    """The inputs ``client_process_main`` sends, recomputed for checking."""
    rng = np.random.default_rng(seed)
    return {i: rng.normal(size=(rows + i, 64)).astype(np.float32) for i in range(batches)}

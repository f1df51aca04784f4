"""The server and the requests of the tests of Triton's example models
(``test_triton_example_models.py`` over gRPC, ``test_triton_example_models_http.py`` over HTTP).

``udfserve models generate --triton-examples`` writes ``simple``, ``simple_int8``,
``simple_string``, ``simple_identity`` and ``custom_identity_int32`` with the tensor names,
datatypes and shapes Triton's published example clients (triton-inference-server/client,
``src/python/examples``) expect; the tests do what those clients do, in their own words.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_harness import running_server
from tritonclient.grpc import service_pb2

from udfserve.services.examples.triton_examples import generate_triton_examples
from udfserve.services.model_server.launcher import ServerProcess

FIRST = np.arange(16, dtype=np.int32).reshape(1, 16)
SECOND = np.full((1, 16), 3, dtype=np.int32)
ANSWER_WAIT_S = 60.0
MODELS = ["simple", "simple_int8", "simple_string", "simple_identity", "custom_identity_int32"]


@contextmanager
def triton_examples_server(
    tmp_path_factory: pytest.TempPathFactory, socket_dir: Path, name: str
) -> Iterator[ServerProcess]:
    """A server of the generated models, with the KServe HTTP port and ``--model-control
    explicit`` (the examples load and unload), stopped on exit."""
    repository = tmp_path_factory.mktemp(f"{name}-repo")
    assert generate_triton_examples(repository) == MODELS
    extra = ["--kserve-http-port", "0", "--model-control", "explicit"]
    with running_server(repository, socket_dir, tmp_path_factory, name, extra) as process:
        yield process


def int32_pair(module: Any, binary: bool | None = None) -> list[Any]:
    """``INPUT0`` and ``INPUT1`` of ``simple`` as ``module``'s InferInputs (``binary``: HTTP's
    binary tensor extension, None for gRPC)."""
    tensors = []
    for name, values in (("INPUT0", FIRST), ("INPUT1", SECOND)):
        tensor = module.InferInput(name, list(values.shape), "INT32")
        if binary is None:
            tensor.set_data_from_numpy(values)
        else:
            tensor.set_data_from_numpy(values, binary_data=binary)
        tensors.append(tensor)
    return tensors


def as_text(values: np.ndarray) -> np.ndarray:
    """Numbers as the BYTES strings ``simple_string`` takes and answers."""
    return np.array([str(value).encode() for value in values.ravel()], dtype=np.object_).reshape(values.shape)


def assert_sum_and_difference(result: Any) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), FIRST + SECOND)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), FIRST - SECOND)


def raw_request(model: str, datatype: str) -> service_pb2.ModelInferRequest:
    """A ``ModelInferRequest`` of ``INPUT0`` and ``INPUT1``, ``[1, 16]``, no contents yet."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
    return request

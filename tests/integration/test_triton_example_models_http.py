"""What Triton's published example clients do over HTTP, against a real server of the models
they call (``triton_example_requests`` says which): tritonclient's HTTP client (sync, async
handles, asyncio), binary and JSON tensors, strings, system shared memory, statistics, metadata,
and the error words clients written against Triton look for. The examples themselves are run,
unchanged, by ``scripts/triton_examples.sh`` (docs/kserve.md has its table).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_http_aio
import tritonclient.utils.shared_memory as shm
from triton_example_requests import (
    ANSWER_WAIT_S,
    FIRST,
    SECOND,
    as_text,
    assert_sum_and_difference,
    int32_pair,
    triton_examples_server,
)
from tritonclient.utils import InferenceServerException

from udfserve.services.model_server.launcher import ServerProcess


@pytest.fixture(scope="module")
def examples_server(tmp_path_factory: pytest.TempPathFactory, socket_dir: Path) -> Iterator[ServerProcess]:
    with triton_examples_server(tmp_path_factory, socket_dir, "triton-examples-http") as process:
        yield process


@pytest.fixture(scope="module")
def http_client(examples_server: ServerProcess) -> Iterator[triton_http.InferenceServerClient]:
    assert examples_server.kserve_http_address is not None
    with triton_http.InferenceServerClient(examples_server.kserve_http_address) as client:
        yield client


@pytest.mark.parametrize("binary", [True, False], ids=["binary-tensors", "json-tensors"])
def test_simple_adds_and_subtracts_over_http(http_client: Any, binary: bool) -> None:
    outputs = [triton_http.InferRequestedOutput(name, binary_data=binary) for name in ("OUTPUT0", "OUTPUT1")]

    result = http_client.infer("simple", int32_pair(triton_http, binary), outputs=outputs)

    assert_sum_and_difference(result)


def test_simple_string_mixes_binary_and_json_strings_over_http(http_client: Any) -> None:
    tensors = [triton_http.InferInput(name, [1, 16], "BYTES") for name in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(as_text(FIRST), binary_data=True)
    tensors[1].set_data_from_numpy(as_text(SECOND), binary_data=False)
    outputs = [
        triton_http.InferRequestedOutput("OUTPUT0", binary_data=True),
        triton_http.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]

    result = http_client.infer("simple_string", tensors, outputs=outputs)

    assert [int(text) for text in result.as_numpy("OUTPUT0").ravel()] == (FIRST + SECOND).ravel().tolist()
    assert [int(text) for text in result.as_numpy("OUTPUT1").ravel()] == (FIRST - SECOND).ravel().tolist()


def test_async_infer_over_http_answers_through_its_handle(http_client: Any) -> None:
    handle = http_client.async_infer("simple", int32_pair(triton_http, binary=True))

    assert_sum_and_difference(handle.get_result(timeout=ANSWER_WAIT_S))


def test_the_asyncio_http_client_infers_simple(examples_server: ServerProcess) -> None:
    async def infer() -> Any:
        client = triton_http_aio.InferenceServerClient(examples_server.kserve_http_address or "")
        try:
            return await client.infer("simple", int32_pair(triton_http_aio, binary=True))
        finally:
            await client.close()

    assert_sum_and_difference(asyncio.run(infer()))


def test_statistics_over_http_are_one_model(http_client: Any) -> None:
    http_client.infer("simple", int32_pair(triton_http, binary=True))

    assert [stats["name"] for stats in http_client.get_inference_statistics("simple")["model_stats"]] == [
        "simple"
    ]


def test_simple_reads_and_writes_shared_memory_over_http(http_client: Any) -> None:
    byte_size = FIRST.nbytes
    regions = {f"{name}-{uuid.uuid4().hex[:8]}": name for name in ("in0", "in1", "out0", "out1")}
    handles = {
        name: shm.create_shared_memory_region(name, f"/udfserve-triton-{name}", byte_size) for name in regions
    }
    by_role = {role: name for name, role in regions.items()}
    try:
        shm.set_shared_memory_region(handles[by_role["in0"]], [FIRST])
        shm.set_shared_memory_region(handles[by_role["in1"]], [SECOND])
        for name in regions:
            http_client.register_system_shared_memory(name, f"/udfserve-triton-{name}", byte_size)
        tensors = [triton_http.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        tensors[0].set_shared_memory(by_role["in0"], byte_size)
        tensors[1].set_shared_memory(by_role["in1"], byte_size)
        outputs = [
            triton_http.InferRequestedOutput(name, binary_data=True) for name in ("OUTPUT0", "OUTPUT1")
        ]
        outputs[0].set_shared_memory(by_role["out0"], byte_size)
        outputs[1].set_shared_memory(by_role["out1"], byte_size)

        http_client.infer("simple", tensors, outputs=outputs)

        out0 = shm.get_contents_as_numpy(handles[by_role["out0"]], np.int32, [1, 16])
        out1 = shm.get_contents_as_numpy(handles[by_role["out1"]], np.int32, [1, 16])
        np.testing.assert_array_equal(out0, FIRST + SECOND)
        np.testing.assert_array_equal(out1, FIRST - SECOND)
    finally:
        for name in regions:
            http_client.unregister_system_shared_memory(name)
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)


def test_infer_of_an_unknown_model_over_http_begins_with_tritons_words(http_client: Any) -> None:
    with pytest.raises(InferenceServerException) as raised:
        http_client.infer("wrong_model_name", int32_pair(triton_http, binary=True))

    assert raised.value.status() == "404"
    assert raised.value.message().startswith("Request for unknown model")


def test_unregistering_every_cuda_region_over_http_succeeds(http_client: Any) -> None:
    http_client.unregister_cuda_shared_memory()

    with pytest.raises(InferenceServerException) as raised:
        http_client.get_cuda_shared_memory_status()
    assert raised.value.status() == "501"


def test_metadata_over_http_names_the_model_and_its_tensors(http_client: Any) -> None:
    metadata = http_client.get_model_metadata("simple")

    assert metadata["name"] == "simple"
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]

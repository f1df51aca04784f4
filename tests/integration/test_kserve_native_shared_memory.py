"""KServe system shared memory on the native front end's port (``--kserve-frontend native``), spoken
by tritonclient's gRPC client and its shared-memory utilities against a real udfserve process.

One server with a token, the native port beside the main one, and small per-client bounds. The
regions are the server's, one table for both ports (as Triton's are server-wide): what is
registered through one port is listed, used and unregistered through the other, and a client's
registrations through both ports count against its one bound. ``test_kserve_shared_memory.py``
runs the rest of the extension (refused keys and links, outputs too large, streams, HTTP) on the
main port, through the same servicer.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.utils.shared_memory as shm
from kserve_regions import (
    INPUT_BYTES,
    OUTPUT_BYTES,
    ROWS,
    SHM_FOLDER,
    inline_answer,
    new_region,
    refusal,
    regions_removed_after,
)

from udfserve.services.model_server.launcher import ServerProcess, launch_server

TOKEN = "native-shm-token"
AUTHORIZED = {"authorization": f"Bearer {TOKEN}"}
MAX_REGIONS_PER_CLIENT = 4


@pytest.fixture(scope="module")
def server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("native-shm-repo")
    shutil.copytree(tabular_onnx_repository / "tabular_mlp", repository / "tabular_mlp")
    process = launch_server(
        repository,
        socket=socket_dir / "native-shm.sock",
        log_path=repository.parent / "native-shm.log",
        extra_args=[
            *("--kserve-frontend", "native", "--kserve-port", "0"),
            *("--auth-token", TOKEN),
            *("--kserve-shared-memory-max-regions-per-client", str(MAX_REGIONS_PER_CLIENT)),
        ],
    )
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def native(server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    """A client of the native port."""
    assert server.kserve_address is not None and server.kserve_address != server.tcp_address
    with triton.InferenceServerClient(server.kserve_address) as client:
        yield client


@pytest.fixture(scope="module")
def main(server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    """A client of the main gRPC port (the python front end)."""
    assert server.tcp_address is not None
    with triton.InferenceServerClient(server.tcp_address) as client:
        yield client


@pytest.fixture
def regions(main: triton.InferenceServerClient) -> Iterator[list[Any]]:
    """The regions a test creates (``new_region``), unregistered and destroyed after it."""
    with regions_removed_after(main, AUTHORIZED) as created:
        yield created


def features(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(ROWS, 64)).astype(np.float32)


def shm_infer(client: triton.InferenceServerClient, input_region: str, output_region: str | None) -> Any:
    tensor = triton.InferInput("features", [ROWS, 64], "FP32")
    tensor.set_shared_memory(input_region, INPUT_BYTES)
    output = triton.InferRequestedOutput("probabilities")
    if output_region is not None:
        output.set_shared_memory(output_region, OUTPUT_BYTES)
    return client.infer("tabular_mlp", [tensor], outputs=[output], headers=AUTHORIZED)


def test_the_native_port_lists_system_shared_memory_as_the_main_port_does(
    native: triton.InferenceServerClient, main: triton.InferenceServerClient
) -> None:
    extensions = list(native.get_server_metadata(headers=AUTHORIZED).extensions)
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions
    assert extensions == list(main.get_server_metadata(headers=AUTHORIZED).extensions)


def test_native_inference_reads_inputs_from_a_region_and_writes_outputs_into_one(
    native: triton.InferenceServerClient, regions: list
) -> None:
    x = features(1)
    input_name, input_key, input_handle = new_region(regions, INPUT_BYTES)
    output_name, output_key, output_handle = new_region(regions, OUTPUT_BYTES)
    shm.set_shared_memory_region(input_handle, [x])
    native.register_system_shared_memory(input_name, input_key, INPUT_BYTES, headers=AUTHORIZED)
    native.register_system_shared_memory(output_name, output_key, OUTPUT_BYTES, headers=AUTHORIZED)

    result = shm_infer(native, input_name, output_name)

    output = result.get_output("probabilities")
    assert list(output.shape) == [ROWS, 8] and output.datatype == "FP32"
    assert output.parameters["shared_memory_byte_size"].int64_param == OUTPUT_BYTES
    written = shm.get_contents_as_numpy(output_handle, np.float32, [ROWS, 8])
    np.testing.assert_array_equal(written, inline_answer(native, x, AUTHORIZED))


def test_a_region_registered_on_one_port_is_listed_on_the_other_until_unregistered_there(
    native: triton.InferenceServerClient, main: triton.InferenceServerClient, regions: list
) -> None:
    name, key, _ = new_region(regions, 1024)
    native.register_system_shared_memory(name, key, 512, offset=256, headers=AUTHORIZED)
    status = main.get_system_shared_memory_status(name, headers=AUTHORIZED).regions[name]
    assert (status.key, status.offset, status.byte_size) == (key, 256, 512)

    main.unregister_system_shared_memory(name, headers=AUTHORIZED)

    assert name not in native.get_system_shared_memory_status(headers=AUTHORIZED).regions
    error = refusal(lambda: native.get_system_shared_memory_status(name, headers=AUTHORIZED))
    assert error.status() == "StatusCode.NOT_FOUND" and name in error.message()


@pytest.mark.parametrize("registered_on, used_on", [("main", "native"), ("native", "main")])
def test_a_region_registered_on_one_port_serves_requests_on_the_other(
    registered_on: str, used_on: str, request: pytest.FixtureRequest, regions: list
) -> None:
    registrar: triton.InferenceServerClient = request.getfixturevalue(registered_on)
    user: triton.InferenceServerClient = request.getfixturevalue(used_on)
    x = features(2)
    input_name, input_key, input_handle = new_region(regions, INPUT_BYTES)
    output_name, output_key, output_handle = new_region(regions, OUTPUT_BYTES)
    shm.set_shared_memory_region(input_handle, [x])
    registrar.register_system_shared_memory(input_name, input_key, INPUT_BYTES, headers=AUTHORIZED)
    registrar.register_system_shared_memory(output_name, output_key, OUTPUT_BYTES, headers=AUTHORIZED)

    shm_infer(user, input_name, output_name)

    written = shm.get_contents_as_numpy(output_handle, np.float32, [ROWS, 8])
    np.testing.assert_array_equal(written, inline_answer(user, x, AUTHORIZED))


def test_a_region_that_shrank_fails_that_native_request_only(
    native: triton.InferenceServerClient, regions: list
) -> None:
    x = features(3)
    name, key, handle = new_region(regions, INPUT_BYTES)
    shm.set_shared_memory_region(handle, [x])
    native.register_system_shared_memory(name, key, INPUT_BYTES, headers=AUTHORIZED)
    os.truncate(SHM_FOLDER / key[1:], INPUT_BYTES // 2)

    error = refusal(lambda: shm_infer(native, name, None))

    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"region '{name}'" in error.message() and "expected it to keep the size" in error.message()
    os.truncate(SHM_FOLDER / key[1:], INPUT_BYTES)
    shm.set_shared_memory_region(handle, [x])
    result = shm_infer(native, name, None)
    np.testing.assert_array_equal(result.as_numpy("probabilities"), inline_answer(native, x, AUTHORIZED))


def test_a_clients_regions_count_against_its_bound_through_both_ports(
    native: triton.InferenceServerClient, main: triton.InferenceServerClient, regions: list
) -> None:
    """The native port names the client by its peer address, as the main port does: the regions
    one host registered through the native port fill the bound the main port then applies."""
    for _ in range(MAX_REGIONS_PER_CLIENT):
        name, key, _ = new_region(regions, 64)
        native.register_system_shared_memory(name, key, 64, headers=AUTHORIZED)
    name, key, _ = new_region(regions, 64)
    for client in (main, native):
        error = refusal(
            lambda client=client: client.register_system_shared_memory(name, key, 64, headers=AUTHORIZED)
        )
        assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "client ipv4:127.0.0.1" in error.message()
        assert "--kserve-shared-memory-max-regions-per-client" in error.message()


def test_shared_memory_calls_on_the_native_port_need_the_token(
    native: triton.InferenceServerClient, main: triton.InferenceServerClient, regions: list
) -> None:
    name, key, _ = new_region(regions, 64)
    for call in (
        lambda: native.register_system_shared_memory(name, key, 64),
        lambda: native.get_system_shared_memory_status(),
        lambda: native.unregister_system_shared_memory(),
    ):
        assert refusal(call).status() == "StatusCode.UNAUTHENTICATED"
    assert len(main.get_system_shared_memory_status(headers=AUTHORIZED).regions) == 0


def test_cuda_shared_memory_on_the_native_port_is_refused_naming_why(
    native: triton.InferenceServerClient,
) -> None:
    error = refusal(lambda: native.get_cuda_shared_memory_status(headers=AUTHORIZED))
    assert error.status() == "StatusCode.UNIMPLEMENTED" and "GPU" in error.message()

"""KServe system shared memory against a real udfserve process, spoken by tritonclient's gRPC and
HTTP clients and its own shared-memory utilities (``tritonclient.utils.shared_memory``).

One server with a token, the HTTP port, and small bounds on registered regions: registration,
status and unregistration through both protocols, inputs read from a region and outputs written
into one (answers equal to the inline ones), the regions the server refuses (outside its folder,
a symbolic link), a region that shrank after registration (INVALID_ARGUMENT for that request
only), the bounds (RESOURCE_EXHAUSTED naming them, one client's regions counted through both
protocols), and the token. Last, a server whose shared-memory folder is off refuses it.
"""

from __future__ import annotations

import os
import queue
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
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

TOKEN = "kserve-shm-token"
AUTHORIZED = {"authorization": f"Bearer {TOKEN}"}
MAX_REGIONS_PER_CLIENT = 4
MAX_BYTES_PER_CLIENT = 1 << 20


@pytest.fixture(scope="module")
def server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("kserve-shm-repo")
    shutil.copytree(tabular_onnx_repository / "tabular_mlp", repository / "tabular_mlp")
    process = launch_server(
        repository,
        socket=socket_dir / "kserve-shm.sock",
        log_path=repository.parent / "kserve-shm.log",
        extra_args=[
            "--kserve-http-port",
            "0",
            "--auth-token",
            TOKEN,
            "--kserve-shared-memory-max-regions-per-client",
            str(MAX_REGIONS_PER_CLIENT),
            "--kserve-shared-memory-max-bytes-per-client",
            str(MAX_BYTES_PER_CLIENT),
        ],
    )
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[triton_grpc.InferenceServerClient]:
    assert server.tcp_address is not None
    with triton_grpc.InferenceServerClient(server.tcp_address) as client:
        yield client


@pytest.fixture(scope="module")
def http_client(server: ServerProcess) -> Iterator[triton_http.InferenceServerClient]:
    assert server.kserve_http_address is not None
    with triton_http.InferenceServerClient(server.kserve_http_address) as client:
        yield client


@pytest.fixture
def regions(grpc_client: triton_grpc.InferenceServerClient) -> Iterator[list[Any]]:
    """The regions a test creates (``new_region``), unregistered and destroyed after it."""
    with regions_removed_after(grpc_client, AUTHORIZED) as created:
        yield created


def features(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).normal(size=(rows, 64)).astype(np.float32)


def grpc_shm_infer(
    client: triton_grpc.InferenceServerClient, input_region: str, output_region: str | None
) -> Any:
    tensor = triton_grpc.InferInput("features", [ROWS, 64], "FP32")
    tensor.set_shared_memory(input_region, INPUT_BYTES)
    output = triton_grpc.InferRequestedOutput("probabilities")
    if output_region is not None:
        output.set_shared_memory(output_region, OUTPUT_BYTES)
    return client.infer("tabular_mlp", [tensor], outputs=[output], headers=AUTHORIZED)


def test_the_server_lists_system_shared_memory_among_its_extensions(
    grpc_client: triton_grpc.InferenceServerClient, http_client: triton_http.InferenceServerClient
) -> None:
    extensions = list(grpc_client.get_server_metadata(headers=AUTHORIZED).extensions)
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions
    assert http_client.get_server_metadata(headers=AUTHORIZED)["extensions"] == extensions


def test_a_region_registered_over_grpc_is_in_the_status_of_both_protocols_until_unregistered(
    grpc_client: triton_grpc.InferenceServerClient,
    http_client: triton_http.InferenceServerClient,
    regions: list,
) -> None:
    name, key, _ = new_region(regions, 4096)
    grpc_client.register_system_shared_memory(name, key, 1024, offset=512, headers=AUTHORIZED)
    status = grpc_client.get_system_shared_memory_status(name, headers=AUTHORIZED)
    region = status.regions[name]
    assert (region.name, region.key, region.offset, region.byte_size) == (name, key, 512, 1024)
    assert http_client.get_system_shared_memory_status(name, headers=AUTHORIZED) == [
        {"name": name, "key": key, "offset": 512, "byte_size": 1024}
    ]
    http_client.unregister_system_shared_memory(name, headers=AUTHORIZED)
    assert name not in grpc_client.get_system_shared_memory_status(headers=AUTHORIZED).regions
    error = refusal(lambda: grpc_client.get_system_shared_memory_status(name, headers=AUTHORIZED))
    assert error.status() == "StatusCode.NOT_FOUND" and name in error.message()


def test_unregister_without_a_name_unregisters_every_region(
    grpc_client: triton_grpc.InferenceServerClient,
    http_client: triton_http.InferenceServerClient,
    regions: list,
) -> None:
    for _ in range(2):
        name, key, _ = new_region(regions, 256)
        http_client.register_system_shared_memory(name, key, 256, headers=AUTHORIZED)
    assert len(grpc_client.get_system_shared_memory_status(headers=AUTHORIZED).regions) == 2
    grpc_client.unregister_system_shared_memory(headers=AUTHORIZED)
    assert len(grpc_client.get_system_shared_memory_status(headers=AUTHORIZED).regions) == 0
    assert http_client.get_system_shared_memory_status(headers=AUTHORIZED) == []


def test_grpc_inference_reads_inputs_from_a_region_and_writes_outputs_into_one(
    grpc_client: triton_grpc.InferenceServerClient, regions: list
) -> None:
    x = features(ROWS)
    input_name, input_key, input_handle = new_region(regions, INPUT_BYTES)
    output_name, output_key, output_handle = new_region(regions, OUTPUT_BYTES)
    shm.set_shared_memory_region(input_handle, [x])
    grpc_client.register_system_shared_memory(input_name, input_key, INPUT_BYTES, headers=AUTHORIZED)
    grpc_client.register_system_shared_memory(output_name, output_key, OUTPUT_BYTES, headers=AUTHORIZED)

    result = grpc_shm_infer(grpc_client, input_name, output_name)

    output = result.get_output("probabilities")
    assert list(output.shape) == [ROWS, 8] and output.datatype == "FP32"
    assert output.parameters["shared_memory_byte_size"].int64_param == OUTPUT_BYTES
    written = shm.get_contents_as_numpy(output_handle, np.float32, [ROWS, 8])
    np.testing.assert_array_equal(written, inline_answer(grpc_client, x, AUTHORIZED))


def test_an_output_written_into_a_region_keeps_an_empty_raw_output_contents_entry(
    grpc_client: triton_grpc.InferenceServerClient, regions: list
) -> None:
    """As Triton answers: its C++ client (perf_analyzer's) reads ``raw_output_contents[i]`` for
    every output ``i``, and crashes where the entry is missing."""
    input_name, input_key, input_handle = new_region(regions, INPUT_BYTES)
    output_name, output_key, _ = new_region(regions, OUTPUT_BYTES)
    shm.set_shared_memory_region(input_handle, [features(ROWS)])
    grpc_client.register_system_shared_memory(input_name, input_key, INPUT_BYTES, headers=AUTHORIZED)
    grpc_client.register_system_shared_memory(output_name, output_key, OUTPUT_BYTES, headers=AUTHORIZED)

    response = grpc_shm_infer(grpc_client, input_name, output_name).get_response()

    assert [output.name for output in response.outputs] == ["probabilities"]
    assert list(response.raw_output_contents) == [b""]


def test_grpc_inference_from_a_region_answers_outputs_inline_when_not_asked_in_one(
    grpc_client: triton_grpc.InferenceServerClient, regions: list
) -> None:
    x = features(ROWS)
    name, key, handle = new_region(regions, INPUT_BYTES)
    shm.set_shared_memory_region(handle, [x])
    grpc_client.register_system_shared_memory(name, key, INPUT_BYTES, headers=AUTHORIZED)
    result = grpc_shm_infer(grpc_client, name, None)
    np.testing.assert_array_equal(result.as_numpy("probabilities"), inline_answer(grpc_client, x, AUTHORIZED))


def test_a_stream_reads_inputs_from_a_region_and_writes_outputs_into_one(
    grpc_client: triton_grpc.InferenceServerClient, regions: list
) -> None:
    x = features(ROWS)
    input_name, input_key, input_handle = new_region(regions, INPUT_BYTES)
    output_name, output_key, output_handle = new_region(regions, OUTPUT_BYTES)
    shm.set_shared_memory_region(input_handle, [x])
    grpc_client.register_system_shared_memory(input_name, input_key, INPUT_BYTES, headers=AUTHORIZED)
    grpc_client.register_system_shared_memory(output_name, output_key, OUTPUT_BYTES, headers=AUTHORIZED)
    tensor = triton_grpc.InferInput("features", [ROWS, 64], "FP32")
    tensor.set_shared_memory(input_name, INPUT_BYTES)
    output = triton_grpc.InferRequestedOutput("probabilities")
    output.set_shared_memory(output_name, OUTPUT_BYTES)
    answers: queue.Queue[Any] = queue.Queue()

    grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=AUTHORIZED)
    try:
        grpc_client.async_stream_infer("tabular_mlp", [tensor], outputs=[output], request_id="shm")
        result, error = answers.get(timeout=60)
    finally:
        grpc_client.stop_stream()

    assert error is None and result.get_response().id == "shm"
    written = shm.get_contents_as_numpy(output_handle, np.float32, [ROWS, 8])
    np.testing.assert_array_equal(written, inline_answer(grpc_client, x, AUTHORIZED))


def test_http_inference_reads_inputs_from_a_region_and_writes_outputs_into_one(
    grpc_client: triton_grpc.InferenceServerClient,
    http_client: triton_http.InferenceServerClient,
    regions: list,
) -> None:
    x = features(ROWS)
    input_name, input_key, input_handle = new_region(regions, INPUT_BYTES)
    output_name, output_key, output_handle = new_region(regions, OUTPUT_BYTES)
    shm.set_shared_memory_region(input_handle, [x])
    http_client.register_system_shared_memory(input_name, input_key, INPUT_BYTES, headers=AUTHORIZED)
    http_client.register_system_shared_memory(output_name, output_key, OUTPUT_BYTES, headers=AUTHORIZED)
    tensor = triton_http.InferInput("features", [ROWS, 64], "FP32")
    tensor.set_shared_memory(input_name, INPUT_BYTES)
    output = triton_http.InferRequestedOutput("probabilities", binary_data=True)
    output.set_shared_memory(output_name, OUTPUT_BYTES)

    result = http_client.infer("tabular_mlp", [tensor], outputs=[output], headers=AUTHORIZED)

    answered = result.get_output("probabilities")
    assert answered["shape"] == [ROWS, 8] and "data" not in answered
    assert answered["parameters"]["shared_memory_byte_size"] == OUTPUT_BYTES
    written = shm.get_contents_as_numpy(output_handle, np.float32, [ROWS, 8])
    np.testing.assert_array_equal(written, inline_answer(grpc_client, x, AUTHORIZED))


def test_a_key_outside_the_shared_memory_folder_is_refused(
    grpc_client: triton_grpc.InferenceServerClient, http_client: triton_http.InferenceServerClient
) -> None:
    for key in ("/../etc/passwd", "/sub/folder", "relative", "/.."):
        error = refusal(
            lambda key=key: grpc_client.register_system_shared_memory("outside", key, 8, headers=AUTHORIZED)
        )
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert f"key {key!r}" in error.message() and "/dev/shm" in error.message()
    error = refusal(
        lambda: http_client.register_system_shared_memory("outside", "/a/b", 8, headers=AUTHORIZED)
    )
    assert error.status() == "400" and "/dev/shm" in error.message()


def test_a_symbolic_link_in_the_shared_memory_folder_is_refused(
    grpc_client: triton_grpc.InferenceServerClient, regions: list
) -> None:
    _, key, _ = new_region(regions, 1024)
    link = SHM_FOLDER / f"udfserve-test-link-{uuid.uuid4().hex[:12]}"
    link.symlink_to(SHM_FOLDER / key[1:])
    try:
        error = refusal(
            lambda: grpc_client.register_system_shared_memory(
                "link", f"/{link.name}", 1024, headers=AUTHORIZED
            )
        )
    finally:
        link.unlink()
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "symbolic link" in error.message()


def test_a_region_that_shrank_fails_that_request_only(
    grpc_client: triton_grpc.InferenceServerClient, regions: list
) -> None:
    x = features(ROWS)
    name, key, handle = new_region(regions, INPUT_BYTES)
    shm.set_shared_memory_region(handle, [x])
    grpc_client.register_system_shared_memory(name, key, INPUT_BYTES, headers=AUTHORIZED)
    path = SHM_FOLDER / key[1:]

    os.truncate(path, 100)
    error = refusal(lambda: grpc_shm_infer(grpc_client, name, None))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"region {name!r}" in error.message() and f"offset 0, {INPUT_BYTES} bytes" in error.message()

    os.truncate(path, INPUT_BYTES)  # the client's object restored: the same registration serves again
    shm.set_shared_memory_region(handle, [x])
    result = grpc_shm_infer(grpc_client, name, None)
    np.testing.assert_array_equal(result.as_numpy("probabilities"), inline_answer(grpc_client, x, AUTHORIZED))


def test_registrations_beyond_a_clients_bounds_are_resource_exhausted_naming_the_bound(
    grpc_client: triton_grpc.InferenceServerClient, regions: list
) -> None:
    for _ in range(MAX_REGIONS_PER_CLIENT):
        name, key, _ = new_region(regions, 64)
        grpc_client.register_system_shared_memory(name, key, 64, headers=AUTHORIZED)
    name, key, _ = new_region(regions, 64)
    error = refusal(lambda: grpc_client.register_system_shared_memory(name, key, 64, headers=AUTHORIZED))
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "--kserve-shared-memory-max-regions-per-client" in error.message()

    grpc_client.unregister_system_shared_memory(headers=AUTHORIZED)
    name, key, _ = new_region(regions, MAX_BYTES_PER_CLIENT + 1)
    error = refusal(
        lambda: grpc_client.register_system_shared_memory(
            name, key, MAX_BYTES_PER_CLIENT + 1, headers=AUTHORIZED
        )
    )
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "--kserve-shared-memory-max-bytes-per-client" in error.message()


def test_a_clients_regions_count_against_its_bound_through_both_protocols(
    grpc_client: triton_grpc.InferenceServerClient,
    http_client: triton_http.InferenceServerClient,
    regions: list,
) -> None:
    for _ in range(MAX_REGIONS_PER_CLIENT):
        name, key, _ = new_region(regions, 64)
        grpc_client.register_system_shared_memory(name, key, 64, headers=AUTHORIZED)
    name, key, _ = new_region(regions, 64)
    error = refusal(lambda: http_client.register_system_shared_memory(name, key, 64, headers=AUTHORIZED))
    assert error.status() == "429" and "--kserve-shared-memory-max-regions-per-client" in error.message()


def test_an_output_larger_than_its_range_is_invalid_argument_and_the_next_request_is_served(
    grpc_client: triton_grpc.InferenceServerClient, regions: list
) -> None:
    x = features(ROWS)
    input_name, input_key, input_handle = new_region(regions, INPUT_BYTES)
    output_name, output_key, _ = new_region(regions, OUTPUT_BYTES)
    shm.set_shared_memory_region(input_handle, [x])
    grpc_client.register_system_shared_memory(input_name, input_key, INPUT_BYTES, headers=AUTHORIZED)
    grpc_client.register_system_shared_memory(output_name, output_key, OUTPUT_BYTES, headers=AUTHORIZED)
    tensor = triton_grpc.InferInput("features", [ROWS, 64], "FP32")
    tensor.set_shared_memory(input_name, INPUT_BYTES)
    output = triton_grpc.InferRequestedOutput("probabilities")
    output.set_shared_memory(output_name, OUTPUT_BYTES // 2)

    error = refusal(lambda: grpc_client.infer("tabular_mlp", [tensor], outputs=[output], headers=AUTHORIZED))

    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"output 'probabilities' is {OUTPUT_BYTES} bytes" in error.message()
    np.testing.assert_array_equal(
        grpc_shm_infer(grpc_client, input_name, None).as_numpy("probabilities"),
        inline_answer(grpc_client, x, AUTHORIZED),
    )


def test_shared_memory_calls_need_the_token_on_both_protocols(
    grpc_client: triton_grpc.InferenceServerClient,
    http_client: triton_http.InferenceServerClient,
    regions: list,
) -> None:
    name, key, _ = new_region(regions, 64)
    for call in (
        lambda: grpc_client.register_system_shared_memory(name, key, 64),
        lambda: grpc_client.get_system_shared_memory_status(),
        lambda: grpc_client.unregister_system_shared_memory(),
    ):
        assert refusal(call).status() == "StatusCode.UNAUTHENTICATED"
    for call in (
        lambda: http_client.register_system_shared_memory(name, key, 64),
        lambda: http_client.get_system_shared_memory_status(),
        lambda: http_client.unregister_system_shared_memory(),
    ):
        assert refusal(call).status() == "401"
    assert len(grpc_client.get_system_shared_memory_status(headers=AUTHORIZED).regions) == 0


def test_cuda_shared_memory_is_refused_naming_why(
    grpc_client: triton_grpc.InferenceServerClient, http_client: triton_http.InferenceServerClient
) -> None:
    error = refusal(lambda: grpc_client.get_cuda_shared_memory_status(headers=AUTHORIZED))
    assert error.status() == "StatusCode.UNIMPLEMENTED" and "GPU" in error.message()
    error = refusal(lambda: http_client.get_cuda_shared_memory_status(headers=AUTHORIZED))
    assert error.status() == "501" and "GPU" in error.message()


@pytest.fixture(scope="module")
def server_without_shared_memory(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("kserve-shm-off-repo")
    shutil.copytree(tabular_onnx_repository / "tabular_mlp", repository / "tabular_mlp")
    process = launch_server(
        repository,
        socket=socket_dir / "kserve-shm-off.sock",
        log_path=repository.parent / "kserve-shm-off.log",
        extra_args=["--kserve-http-port", "0", "--shared-memory-dir", "off"],
    )
    yield process
    process.terminate()


def test_with_the_shared_memory_folder_off_system_shared_memory_is_refused_and_not_listed(
    server_without_shared_memory: ServerProcess,
) -> None:
    assert server_without_shared_memory.tcp_address is not None
    assert server_without_shared_memory.kserve_http_address is not None
    with (
        triton_grpc.InferenceServerClient(server_without_shared_memory.tcp_address) as grpc_client,
        triton_http.InferenceServerClient(server_without_shared_memory.kserve_http_address) as http_client,
    ):
        assert "system_shared_memory" not in grpc_client.get_server_metadata().extensions
        error = refusal(lambda: grpc_client.register_system_shared_memory("r", "/udfserve-off", 64))
        assert error.status() == "StatusCode.UNIMPLEMENTED" and "--shared-memory-dir off" in error.message()
        error = refusal(lambda: http_client.get_system_shared_memory_status())
        assert error.status() == "501" and "--shared-memory-dir off" in error.message()

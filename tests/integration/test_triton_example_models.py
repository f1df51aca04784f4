"""What Triton's published example clients do over gRPC, against a real server of the models
they call (``triton_example_requests`` says which): tritonclient's gRPC client (sync, callback,
asyncio), raw protobuf messages with typed contents, system shared memory, metadata, config, the
repository index and a load with a config, and the error words clients written against Triton
look for. The examples themselves are run, unchanged, by ``scripts/triton_examples.sh``
(docs/kserve.md has its table).
"""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
import tritonclient.utils.shared_memory as shm
from triton_example_requests import (
    ANSWER_WAIT_S,
    FIRST,
    SECOND,
    as_text,
    assert_sum_and_difference,
    int32_pair,
    raw_request,
    triton_examples_server,
)
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import (
    InferenceServerException,
    deserialize_bytes_tensor,
    serialize_byte_tensor,
    serialized_byte_size,
)

from udfserve.services.examples.triton_examples import MAX_BATCH_SIZE
from udfserve.services.model_server.launcher import ServerProcess


@pytest.fixture(scope="module")
def examples_server(tmp_path_factory: pytest.TempPathFactory, socket_dir: Path) -> Iterator[ServerProcess]:
    with triton_examples_server(tmp_path_factory, socket_dir, "triton-examples-grpc") as process:
        yield process


@pytest.fixture(scope="module")
def grpc_client(examples_server: ServerProcess) -> Iterator[triton_grpc.InferenceServerClient]:
    with triton_grpc.InferenceServerClient(examples_server.kserve_target()) as client:
        yield client


def test_simple_adds_and_subtracts_the_requested_outputs_over_grpc(grpc_client: Any) -> None:
    outputs = [triton_grpc.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]

    result = grpc_client.infer("simple", int32_pair(triton_grpc), outputs=outputs, headers={"test": "1"})

    assert result.as_numpy("OUTPUT0").dtype == np.int32
    assert_sum_and_difference(result)


def test_simple_answers_every_output_when_the_request_names_none(grpc_client: Any) -> None:
    result = grpc_client.infer("simple", int32_pair(triton_grpc))

    assert sorted(output.name for output in result.get_response().outputs) == ["OUTPUT0", "OUTPUT1"]
    assert_sum_and_difference(result)


def test_statistics_of_simple_are_one_model_counting_its_inferences(grpc_client: Any) -> None:
    before = grpc_client.get_inference_statistics("simple").model_stats
    grpc_client.infer("simple", int32_pair(triton_grpc))
    after = grpc_client.get_inference_statistics("simple").model_stats

    assert [stats.name for stats in after] == ["simple"]
    assert after[0].inference_count == before[0].inference_count + 1


def test_async_infer_hands_the_answer_to_its_callback(grpc_client: Any) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()

    grpc_client.async_infer(
        "simple", int32_pair(triton_grpc), lambda result, error: answers.put((result, error))
    )
    result, error = answers.get(timeout=ANSWER_WAIT_S)

    assert error is None
    assert_sum_and_difference(result)


def test_the_asyncio_grpc_client_infers_simple(examples_server: ServerProcess) -> None:
    async def infer() -> Any:
        async with triton_grpc_aio.InferenceServerClient(examples_server.kserve_target()) as client:
            return await client.infer("simple", int32_pair(triton_grpc_aio))

    assert_sum_and_difference(asyncio.run(infer()))


def test_simple_string_adds_numbers_sent_as_text(grpc_client: Any) -> None:
    tensors = [triton_grpc.InferInput(name, [1, 16], "BYTES") for name in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(as_text(FIRST))
    tensors[1].set_data_from_numpy(as_text(SECOND))

    result = grpc_client.infer("simple_string", tensors)

    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), as_text(FIRST + SECOND))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), as_text(FIRST - SECOND))


@pytest.mark.parametrize("element", [b"he\x00llo", b"\x00\x01\x02\x03"], ids=["nul-inside", "control-bytes"])
def test_simple_identity_returns_its_bytes_unchanged(grpc_client: Any, element: bytes) -> None:
    values = np.array([element] * 16, dtype=np.object_).reshape(1, 16)
    tensor = triton_grpc.InferInput("INPUT0", [1, 16], "BYTES")
    tensor.set_data_from_numpy(values)

    result = grpc_client.infer("simple_identity", [tensor])

    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def test_custom_identity_int32_answers_a_new_client_each_call(examples_server: ServerProcess) -> None:
    for call in range(10):
        with triton_grpc.InferenceServerClient(examples_server.kserve_target()) as client:
            tensor = triton_grpc.InferInput("INPUT0", [1, 16], "INT32")
            tensor.set_data_from_numpy(FIRST + call)
            answer = client.infer("custom_identity_int32", [tensor]).as_numpy("OUTPUT0")
        assert answer.dtype == np.int32
        np.testing.assert_array_equal(answer, FIRST + call)


@pytest.mark.parametrize(
    ("model", "datatype", "dtype"), [("simple", "INT32", np.int32), ("simple_int8", "INT8", np.int8)]
)
def test_typed_int_contents_are_read_as_the_inputs(
    examples_server: ServerProcess, model: str, datatype: str, dtype: type
) -> None:
    request = raw_request(model, datatype)
    request.inputs[0].contents.int_contents[:] = FIRST.ravel().tolist()
    request.inputs[1].contents.int_contents[:] = SECOND.ravel().tolist()

    with grpc.insecure_channel(examples_server.kserve_target()) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=ANSWER_WAIT_S)

    sums = {
        output.name: np.frombuffer(raw, dtype=dtype)
        for output, raw in zip(answer.outputs, answer.raw_output_contents, strict=True)
    }
    np.testing.assert_array_equal(sums["OUTPUT0"], (FIRST + SECOND).ravel())
    np.testing.assert_array_equal(sums["OUTPUT1"], (FIRST - SECOND).ravel())


def test_typed_bytes_contents_are_read_as_string_inputs(examples_server: ServerProcess) -> None:
    request = raw_request("simple_string", "BYTES")
    request.inputs[0].contents.bytes_contents.extend(as_text(FIRST).ravel().tolist())
    request.inputs[1].contents.bytes_contents.extend(as_text(SECOND).ravel().tolist())

    with grpc.insecure_channel(examples_server.kserve_target()) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=ANSWER_WAIT_S)

    sums = [deserialize_bytes_tensor(raw) for raw in answer.raw_output_contents]
    assert [int(text) for text in sums[0]] == (FIRST + SECOND).ravel().tolist()
    assert [int(text) for text in sums[1]] == (FIRST - SECOND).ravel().tolist()


def test_simple_reads_and_writes_system_shared_memory(grpc_client: Any) -> None:
    byte_size = FIRST.nbytes
    regions = {
        name: f"/udfserve-triton-{name}-{uuid.uuid4().hex[:12]}" for name in ("in0", "in1", "out0", "out1")
    }
    handles = {name: shm.create_shared_memory_region(name, key, byte_size) for name, key in regions.items()}
    try:
        shm.set_shared_memory_region(handles["in0"], [FIRST])
        shm.set_shared_memory_region(handles["in1"], [SECOND])
        for name, key in regions.items():
            grpc_client.register_system_shared_memory(name, key, byte_size)
        tensors = [triton_grpc.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        tensors[0].set_shared_memory("in0", byte_size)
        tensors[1].set_shared_memory("in1", byte_size)
        outputs = [triton_grpc.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("out0", byte_size)
        outputs[1].set_shared_memory("out1", byte_size)

        grpc_client.infer("simple", tensors, outputs=outputs)

        written = {
            name: shm.get_contents_as_numpy(handles[name], np.int32, [1, 16]) for name in ("out0", "out1")
        }
        np.testing.assert_array_equal(written["out0"], FIRST + SECOND)
        np.testing.assert_array_equal(written["out1"], FIRST - SECOND)
    finally:
        for name in regions:
            grpc_client.unregister_system_shared_memory(name)
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)


def test_simple_string_reads_and_writes_serialized_strings_in_shared_memory(grpc_client: Any) -> None:
    """Inputs and the sum as Triton lays BYTES out in a region: a 4-byte length before each
    element; the output's region is sized for the answer the client expects."""
    expected = serialize_byte_tensor(as_text(FIRST + SECOND))
    contents = {
        "INPUT0": serialize_byte_tensor(as_text(FIRST)),
        "INPUT1": serialize_byte_tensor(as_text(SECOND)),
        "OUTPUT0": expected,
    }
    suffix = uuid.uuid4().hex[:12]
    regions = {
        tensor: (f"{tensor.lower()}-{suffix}", f"/udfserve-triton-{tensor.lower()}-{suffix}")
        for tensor in contents
    }
    sizes = {tensor: serialized_byte_size(data) for tensor, data in contents.items()}
    handles = {
        tensor: shm.create_shared_memory_region(*regions[tensor], sizes[tensor]) for tensor in contents
    }
    try:
        tensors = []
        for tensor_name, (name, key) in regions.items():
            grpc_client.register_system_shared_memory(name, key, sizes[tensor_name])
            if tensor_name.startswith("INPUT"):
                shm.set_shared_memory_region(handles[tensor_name], [contents[tensor_name]])
                tensor = triton_grpc.InferInput(tensor_name, [1, 16], "BYTES")
                tensor.set_shared_memory(name, sizes[tensor_name])
                tensors.append(tensor)
        output = triton_grpc.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(regions["OUTPUT0"][0], sizes["OUTPUT0"])

        result = grpc_client.infer("simple_string", tensors, outputs=[output])

        answered = result.get_output("OUTPUT0")
        written = shm.get_contents_as_numpy(handles["OUTPUT0"], np.object_, list(answered.shape))
        np.testing.assert_array_equal(written, as_text(FIRST + SECOND))
    finally:
        for name, _key in regions.values():
            grpc_client.unregister_system_shared_memory(name)
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)


def test_metadata_of_simple_names_its_tensors_as_triton_does(grpc_client: Any) -> None:
    metadata = grpc_client.get_model_metadata("simple")

    assert metadata.name == "simple"
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("OUTPUT0", "INT32", [-1, 16]),
        ("OUTPUT1", "INT32", [-1, 16]),
    ]


def test_config_of_simple_has_its_name_and_batch_size(grpc_client: Any) -> None:
    config = grpc_client.get_model_config("simple").config

    assert config.name == "simple"
    assert config.max_batch_size == MAX_BATCH_SIZE
    assert [(tensor.name, list(tensor.dims)) for tensor in config.input] == [
        ("INPUT0", [16]),
        ("INPUT1", [16]),
    ]


def test_the_repository_index_lists_every_example_model_ready(grpc_client: Any) -> None:
    index = grpc_client.get_model_repository_index().models

    assert sorted((model.name, model.state) for model in index) == [
        ("custom_identity_int32", "READY"),
        ("simple", "READY"),
        ("simple_identity", "READY"),
        ("simple_int8", "READY"),
        ("simple_string", "READY"),
    ]


def test_a_load_with_a_config_sets_the_batch_size_until_a_load_without(grpc_client: Any) -> None:
    try:
        grpc_client.load_model("simple", config='{"max_batch_size": 16}')
        assert grpc_client.get_model_config("simple").config.max_batch_size == 16
    finally:
        grpc_client.load_model("simple")
    assert grpc_client.get_model_config("simple").config.max_batch_size == MAX_BATCH_SIZE


def test_metadata_of_an_unknown_model_is_not_found_in_tritons_words(grpc_client: Any) -> None:
    with pytest.raises(InferenceServerException) as raised:
        grpc_client.get_model_metadata("wrong_model_name")

    assert raised.value.status() == "StatusCode.NOT_FOUND"
    assert raised.value.message().startswith("Request for unknown model: 'wrong_model_name'")


def test_a_version_that_is_no_number_is_refused_in_tritons_words(
    examples_server: ServerProcess,
) -> None:
    request = raw_request("simple", "INT32")
    request.model_version = "wrong_specification"
    request.raw_input_contents.extend([FIRST.tobytes(), SECOND.tobytes()])

    with (
        grpc.insecure_channel(examples_server.kserve_target()) as channel,
        pytest.raises(grpc.RpcError) as raised,
    ):
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=ANSWER_WAIT_S)

    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failed to get model version from specified version string 'wrong_specification'" in str(
        raised.value.details()
    )


def test_typed_contents_beside_raw_contents_are_refused_in_tritons_words(
    examples_server: ServerProcess,
) -> None:
    request = raw_request("simple", "INT32")
    request.inputs[0].contents.int_contents[:] = FIRST.ravel()[8:].tolist()
    request.raw_input_contents.append(FIRST.ravel()[:8].tobytes())

    with (
        grpc.insecure_channel(examples_server.kserve_target()) as channel,
        pytest.raises(grpc.RpcError) as raised,
    ):
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=ANSWER_WAIT_S)

    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
        in str(raised.value.details())
    )


def test_unregistering_every_cuda_region_succeeds_with_nothing_to_forget(grpc_client: Any) -> None:
    grpc_client.unregister_cuda_shared_memory()
    grpc_client.unregister_cuda_shared_memory("never_registered")

    with pytest.raises(InferenceServerException) as raised:
        grpc_client.get_cuda_shared_memory_status()
    assert raised.value.status() == "StatusCode.UNIMPLEMENTED"

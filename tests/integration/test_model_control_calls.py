"""``--model-control explicit``: load, unload and index calls, in udfserve's protocol and in the
KServe repository protocol as tritonclient speaks it (on the main port and on the native front
end's), a config given with a load, and the calls refused without explicit mode or the token.

Each test loads and unloads a model of its own, so that the module's one server can serve them
in any order."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from model_control_client import EXPLICIT, add_version, control_repository, index_states, status_of
from server_harness import batch_of, metric_value, request, running_server, scrape
from tritonclient.grpc import service_pb2 as kpb
from tritonclient.utils import InferenceServerException

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess

NATIVE = ["--kserve-frontend", "native", "--kserve-port", "0"]
TOKEN = "control-s3cret"
CALL_TIMEOUT_S = 300.0
"""Safety limit of one call; a load returns once its model serves (seconds on a busy machine)."""
STATE_TIMEOUT_S = 120.0
"""Safety limit of a wait for a model's state in the index (below the test's own time limit)."""
MODEL_OF_FRONT_END = {"python": "multi_io", "native": "text_hashing"}
"""The model each KServe front end's tests load and unload: each its own."""


@pytest.fixture(scope="module")
def repository(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = control_repository(
        example_repository,
        tmp_path_factory.mktemp("control"),
        ["tabular_mlp", "multi_io", "sequence_bilstm", "text_hashing"],
    )
    add_version(root, "tabular_mlp", 2)
    return root


@pytest.fixture(scope="module")
def server(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Explicit model control, serving only tabular_mlp at start, with both KServe front ends. Old
    versions are not leased (``--version-lease-s 0``): the tests here check what the calls load and
    unload, and share one server (tests/integration/test_version_leases.py checks leases)."""
    flags = [*EXPLICIT, "--models", "tabular_mlp", "--version-lease-s", "0", *NATIVE]
    with running_server(repository, socket_dir, tmp_path_factory, "control", flags) as process:
        yield process


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[pb_grpc.InferenceStub]:
    with grpc.insecure_channel(server.grpc_target()) as channel:
        yield pb_grpc.InferenceStub(channel)


def kserve_address(server: ServerProcess, front_end: str) -> str:
    address = server.tcp_address if front_end == "python" else server.kserve_address
    assert address is not None
    return address


def triton_index(client: triton.InferenceServerClient, model: str) -> list[tuple[str, str, str]]:
    """(version, state, reason) of each line ``get_model_repository_index`` lists for ``model``."""
    index = client.get_model_repository_index(client_timeout=CALL_TIMEOUT_S)
    return [(entry.version, entry.state, entry.reason) for entry in index.models if entry.name == model]


@pytest.mark.parametrize("front_end", ["python", "native"])
def test_tritonclient_loads_a_model_the_server_did_not_load_at_start(
    server: ServerProcess, front_end: str
) -> None:
    model = MODEL_OF_FRONT_END[front_end]
    with triton.InferenceServerClient(kserve_address(server, front_end)) as client:
        assert triton_index(client, model) == [("", "UNAVAILABLE", "unloaded")]
        assert not client.is_model_ready(model)

        client.load_model(model, client_timeout=CALL_TIMEOUT_S)

        assert client.is_model_ready(model)
        assert triton_index(client, model) == [("1", "READY", "")]
        assert client.get_model_metadata(model).versions == ["1"]


@pytest.mark.parametrize("front_end", ["python", "native"])
def test_tritonclient_unload_makes_the_model_unavailable_and_not_found(
    server: ServerProcess, front_end: str
) -> None:
    model = MODEL_OF_FRONT_END[front_end]
    with triton.InferenceServerClient(kserve_address(server, front_end)) as client:
        client.load_model(model, client_timeout=CALL_TIMEOUT_S)  # loaded by the test before, or now

        client.unload_model(model, client_timeout=CALL_TIMEOUT_S)

        assert not client.is_model_ready(model)
        assert triton_index(client, model) == [("", "UNAVAILABLE", "unloaded")]
        with pytest.raises(InferenceServerException) as raised:
            client.get_model_metadata(model)
        assert raised.value.status() == "StatusCode.NOT_FOUND"
        assert "unloaded" in raised.value.message()


def test_the_server_announces_the_model_repository_extension(server: ServerProcess) -> None:
    with triton.InferenceServerClient(kserve_address(server, "python")) as client:
        assert "model_repository" in client.get_server_metadata().extensions


def test_a_config_given_with_the_load_serves_the_versions_its_policy_names(
    server: ServerProcess, stub: pb_grpc.InferenceStub
) -> None:
    """tabular_mlp has versions 1 and 2; its config.yaml serves the newest. A load with
    ``version_policy: {all: true}`` serves both, each to the requests that pin it; a load without
    a config goes back to config.yaml."""
    x = np.random.default_rng(3).normal(size=(5, 64)).astype(np.float32)
    with triton.InferenceServerClient(kserve_address(server, "python")) as client:
        assert triton_index(client, "tabular_mlp") == [("2", "READY", "")]

        client.load_model(
            "tabular_mlp", config=json.dumps({"version_policy": {"all": True}}), client_timeout=CALL_TIMEOUT_S
        )

        assert triton_index(client, "tabular_mlp") == [("1", "READY", ""), ("2", "READY", "")]
    requests = [request("tabular_mlp", batch_of({"features": x}), batch_id=v, version=v) for v in (0, 1, 2)]
    responses = list(stub.Predict(iter(requests), timeout=CALL_TIMEOUT_S))
    # batch_id: (error code, the version that answered); a request naming no version gets the newest
    assert {r.batch_id: (r.error.code, r.model_version) for r in responses} == {
        0: (0, 2),
        1: (0, 1),
        2: (0, 2),
    }

    loaded = stub.LoadModel(pb.LoadModelRequest(model="tabular_mlp"), timeout=CALL_TIMEOUT_S)

    assert list(loaded.served_versions) == [2]
    assert index_states(stub, "tabular_mlp") == {2: "READY"}


def test_a_load_of_a_model_that_did_not_change_loads_nothing_again(
    server: ServerProcess, stub: pb_grpc.InferenceStub
) -> None:
    before = model_loads(server, "tabular_mlp")

    loaded = stub.LoadModel(pb.LoadModelRequest(model="tabular_mlp"), timeout=CALL_TIMEOUT_S)

    assert list(loaded.served_versions) == [2]
    assert model_loads(server, "tabular_mlp") == before


def test_reload_loads_the_served_version_again_beside_the_one_serving(
    server: ServerProcess, stub: pb_grpc.InferenceStub
) -> None:
    before = model_loads(server, "tabular_mlp")

    loaded = stub.LoadModel(pb.LoadModelRequest(model="tabular_mlp", reload=True), timeout=CALL_TIMEOUT_S)

    assert list(loaded.served_versions) == [2]
    assert model_loads(server, "tabular_mlp") == before + 1
    assert index_states(stub, "tabular_mlp") == {2: "READY"}


def model_loads(server: ServerProcess, model: str) -> float:
    """Loads of ``model``'s versions so far (``udfserve_model_loads_total``)."""
    return metric_value(scrape(server.http_address or ""), "udfserve_model_loads_total", model=model)


def test_udfserve_calls_load_list_and_unload_a_model(stub: pb_grpc.InferenceStub) -> None:
    loaded = stub.LoadModel(pb.LoadModelRequest(model="sequence_bilstm"), timeout=CALL_TIMEOUT_S)
    assert list(loaded.served_versions) == [1]
    assert index_states(stub, "sequence_bilstm") == {1: "READY"}
    ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready_only=True), timeout=CALL_TIMEOUT_S)
    assert ("sequence_bilstm", 1) in {(entry.model, entry.version) for entry in ready.models}

    stub.UnloadModel(pb.UnloadModelRequest(model="sequence_bilstm"), timeout=CALL_TIMEOUT_S)

    assert index_states(stub, "sequence_bilstm") == {0: "UNAVAILABLE"}
    ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready_only=True), timeout=CALL_TIMEOUT_S)
    assert "sequence_bilstm" not in {entry.model for entry in ready.models}
    metadata = stub.GetModelMetadata(pb.ModelMetadataRequest(model="sequence_bilstm"), timeout=CALL_TIMEOUT_S)
    assert metadata.state == pb.MODEL_STATE_UNLOADED


def test_a_load_whose_caller_left_goes_on_until_the_model_serves(stub: pb_grpc.InferenceStub) -> None:
    """A load cut short would leave a version half loaded: the call is cancelled once the index
    lists sequence_bilstm LOADING, and the model still comes to serve."""
    unload = status_of(lambda: stub.UnloadModel(pb.UnloadModelRequest(model="sequence_bilstm"), timeout=60))
    assert unload[0] in {grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND}, unload  # held before, or not
    call = stub.LoadModel.future(pb.LoadModelRequest(model="sequence_bilstm"), timeout=CALL_TIMEOUT_S)
    states = wait_for_index(stub, "sequence_bilstm", lambda states: 0 not in states)
    assert states == {1: "LOADING"}, "the load ended before its caller could leave"
    call.cancel()

    assert wait_for_index(stub, "sequence_bilstm", lambda states: states != {1: "LOADING"}) == {1: "READY"}
    stub.UnloadModel(pb.UnloadModelRequest(model="sequence_bilstm"), timeout=CALL_TIMEOUT_S)


def wait_for_index(
    stub: pb_grpc.InferenceStub, model: str, until: Callable[[dict[int, str]], bool]
) -> dict[int, str]:
    """The index's states of ``model`` once ``until`` holds of them (looked at every 10 ms)."""
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while not until(states := index_states(stub, model)):
        assert time.monotonic() < deadline, f"model {model!r} stayed {states}"
        time.sleep(0.01)  # a look at another process's state between calls
    return states


def test_unload_of_a_model_the_server_does_not_hold_is_not_found(stub: pb_grpc.InferenceStub) -> None:
    code, message = status_of(
        lambda: stub.UnloadModel(pb.UnloadModelRequest(model="no_such_model"), timeout=60)
    )
    assert code == grpc.StatusCode.NOT_FOUND
    assert "'no_such_model' is not loaded here" in message


# -- a server without explicit model control, with a token --------------------------------------


@pytest.fixture(scope="module")
def token_server(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The default model control (none), and a token."""
    folder = tmp_path_factory.mktemp("control-token")
    (folder / "token").write_text(TOKEN + "\n")
    with running_server(
        repository,
        socket_dir,
        tmp_path_factory,
        "control-none",
        ["--models", "tabular_mlp", "--auth-token-file", str(folder / "token")],
    ) as process:
        yield process


AUTHORIZED = [("authorization", f"Bearer {TOKEN}")]


def test_load_and_unload_are_refused_failed_precondition_without_explicit_model_control(
    token_server: ServerProcess,
) -> None:
    with grpc.insecure_channel(token_server.grpc_target()) as channel:
        stub = pb_grpc.InferenceStub(channel)
        calls = {
            "LoadModel": lambda: stub.LoadModel(pb.LoadModelRequest(model="multi_io"), metadata=AUTHORIZED),
            "UnloadModel": lambda: stub.UnloadModel(
                pb.UnloadModelRequest(model="tabular_mlp"), metadata=AUTHORIZED
            ),
        }
        statuses = {name: status_of(call) for name, call in calls.items()}
        assert index_states(stub, "tabular_mlp", AUTHORIZED) == {2: "READY"}
    with triton.InferenceServerClient(token_server.tcp_address or "") as client:
        headers = dict(AUTHORIZED)
        for name, call in {
            "RepositoryModelLoad": lambda: client.load_model("multi_io", headers=headers),
            "RepositoryModelUnload": lambda: client.unload_model("tabular_mlp", headers=headers),
        }.items():
            with pytest.raises(InferenceServerException) as raised:
                call()
            statuses[name] = (
                grpc.StatusCode[raised.value.status().removeprefix("StatusCode.")],
                raised.value.message(),
            )
        assert client.is_model_ready("tabular_mlp", headers=headers)
    for name, (code, message) in statuses.items():
        assert code == grpc.StatusCode.FAILED_PRECONDITION, (name, code, message)
        assert "model control is 'none'" in message and "--model-control explicit" in message, message


CONTROL_METHODS = {
    "/udfserve.v1.Inference/LoadModel": pb.LoadModelRequest(model="multi_io"),
    "/udfserve.v1.Inference/UnloadModel": pb.UnloadModelRequest(model="tabular_mlp"),
    "/udfserve.v1.Inference/RepositoryIndex": pb.RepositoryIndexRequest(),
    "/inference.GRPCInferenceService/RepositoryModelLoad": kpb.RepositoryModelLoadRequest(
        model_name="multi_io"
    ),
    "/inference.GRPCInferenceService/RepositoryModelUnload": kpb.RepositoryModelUnloadRequest(
        model_name="tabular_mlp"
    ),
    "/inference.GRPCInferenceService/RepositoryIndex": kpb.RepositoryIndexRequest(),
}


@pytest.mark.parametrize("method", sorted(CONTROL_METHODS))
def test_every_model_control_call_needs_the_token(token_server: ServerProcess, method: str) -> None:
    message = CONTROL_METHODS[method].SerializeToString()
    with grpc.insecure_channel(token_server.grpc_target()) as channel:
        call = channel.unary_unary(method)
        without = status_of(lambda: call(message, timeout=60))
        wrong = status_of(lambda: call(message, timeout=60, metadata=[("authorization", "Bearer wrong")]))
    assert without[0] == wrong[0] == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer <token>" in without[1]


def test_a_config_given_with_a_load_serves_a_model_whose_config_yaml_does_not_parse(
    stub: pb_grpc.InferenceStub, repository: Path, example_repository: Path
) -> None:
    model = "broken_config"
    shutil.copytree(example_repository / "tabular_mlp" / "1", repository / model / "1")
    (repository / model / "config.yaml").write_text("max_batch_size: [\n", encoding="utf-8")

    code, message = status_of(
        lambda: stub.LoadModel(pb.LoadModelRequest(model=model), timeout=CALL_TIMEOUT_S)
    )
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert "config.yaml is not valid YAML" in message

    loaded = stub.LoadModel(
        pb.LoadModelRequest(model=model, config_json='{"max_batch_size": 64}'), timeout=CALL_TIMEOUT_S
    )
    assert list(loaded.served_versions) == [1]
    metadata = stub.GetModelMetadata(pb.ModelMetadataRequest(model=model), timeout=CALL_TIMEOUT_S)
    assert metadata.max_batch_size == 64
    stub.UnloadModel(pb.UnloadModelRequest(model=model), timeout=CALL_TIMEOUT_S)

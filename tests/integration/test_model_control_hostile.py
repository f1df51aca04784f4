"""Hostile model control calls (``--model-control explicit``): names that would leave the
repository, configs that are not one, Triton's file uploads, a storm of loads and unloads, and an
unload while a stream sends to the model. Each call gets a status that says whose fault it is and
what was expected; the server stays up, within bounded memory, and keeps serving its other models."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from model_control_client import EXPLICIT, control_repository, status_of
from server_harness import batch_of, metric_value, request, running_server, scrape
from test_bounded_memory import MIB, RSS_GROWTH_BOUND_BYTES, PeakMemory
from tritonclient.grpc import service_pb2 as kpb
from tritonclient.grpc import service_pb2_grpc as kpb_grpc
from tritonclient.utils import InferenceServerException

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess

logger = logging.getLogger(__name__)

CALL_TIMEOUT_S = 300.0
"""Safety limit of one call; a load returns once its model serves (seconds on a busy machine)."""
STORM_S = 3.0
STORM_THREADS = 4
STORM_WINDOW = 8
"""Calls each storming thread keeps under way: together more than the 16 the server lets wait."""
CLEAR_STATUSES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@pytest.fixture(scope="module")
def repository(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = control_repository(
        example_repository, tmp_path_factory.mktemp("hostile"), ["tabular_mlp", "multi_io", "sequence_bilstm"]
    )
    (root / "escape").symlink_to("/etc", target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def server(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(
        repository, socket_dir, tmp_path_factory, "hostile-control", [*EXPLICIT, "--models", "tabular_mlp"]
    ) as process:
        yield process


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[pb_grpc.InferenceStub]:
    with grpc.insecure_channel(server.grpc_target()) as channel:
        yield pb_grpc.InferenceStub(channel)


@pytest.fixture(scope="module")
def kserve(server: ServerProcess) -> Iterator[kpb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.tcp_address or "") as channel:
        yield kpb_grpc.GRPCInferenceServiceStub(channel)


def still_serves(stub: pb_grpc.InferenceStub) -> bool:
    """tabular_mlp, loaded at start, answers a batch."""
    x = np.ones((2, 64), dtype=np.float32)
    (response,) = stub.Predict(
        iter([request("tabular_mlp", batch_of({"features": x}))]), timeout=CALL_TIMEOUT_S
    )
    return not response.HasField("error")


NOT_NAMES = [
    "../x",
    "..",
    ".",
    "/etc",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "x" * 4096,
    "",
    "a\x00b",
    "..%2f..%2fetc",
]


@pytest.mark.parametrize("name", NOT_NAMES, ids=lambda name: repr(name[:16]))
def test_load_and_unload_of_a_name_that_is_not_a_model_name_are_invalid_argument(
    stub: pb_grpc.InferenceStub, kserve: kpb_grpc.GRPCInferenceServiceStub, name: str
) -> None:
    calls = {
        "LoadModel": lambda: stub.LoadModel(pb.LoadModelRequest(model=name), timeout=60),
        "UnloadModel": lambda: stub.UnloadModel(pb.UnloadModelRequest(model=name), timeout=60),
        "RepositoryModelLoad": lambda: kserve.RepositoryModelLoad(
            kpb.RepositoryModelLoadRequest(model_name=name), timeout=60
        ),
        "RepositoryModelUnload": lambda: kserve.RepositoryModelUnload(
            kpb.RepositoryModelUnloadRequest(model_name=name), timeout=60
        ),
    }
    for call_name, call in calls.items():
        code, message = status_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (call_name, code, message)
        assert "invalid model name" in message and "expected 1-128 characters of [A-Za-z0-9_.-]" in message
        assert len(message) <= 1000


def test_load_of_a_model_the_repository_does_not_hold_is_not_found(stub: pb_grpc.InferenceStub) -> None:
    code, message = status_of(lambda: stub.LoadModel(pb.LoadModelRequest(model="no_such_model"), timeout=60))
    assert code == grpc.StatusCode.NOT_FOUND
    assert "'no_such_model' is not in the model repository; expected a folder <repo>/no_such_model" in message


def test_load_of_a_folder_that_leads_outside_the_repository_is_refused_naming_where_it_leads(
    stub: pb_grpc.InferenceStub,
) -> None:
    """A model folder that is a link to /etc is the repository's fault, not the caller's: the
    load fails (FAILED_PRECONDITION) and says where the folder leads; nothing under /etc is read."""
    code, message = status_of(lambda: stub.LoadModel(pb.LoadModelRequest(model="escape"), timeout=60))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "resolves to /etc, outside the repository" in message


NOT_CONFIGS = {
    "not JSON": ("{version_policy: all", "is not JSON (Expecting property name"),
    "a list": ("[1, 2]", "is a JSON list, not an object; expected a JSON object"),
    "a string": ('"all"', "is a JSON str, not an object; expected a JSON object"),
    "an unknown field": ('{"model_path": "/etc"}', "model_path: Extra inputs are not permitted"),
    "Triton's config.pbtxt": (
        '{"platform": "tensorflow_savedmodel", "max_batch_size": 8}',
        "platform: Extra inputs are not permitted (got 'tensorflow_savedmodel'); expected udfserve's "
        "config.yaml fields (name, backend, version, version_policy",
    ),
    "two policies": (
        '{"version_policy": {"all": true, "latest": 1}}',
        "exactly one of latest, specific or all",
    ),
    "a version the model has not": ('{"version": 7}', "(version: 7) serves none of the versions [1]"),
    "a name not its own": ('{"name": "other"}', "name 'other' does not match the folder name 'tabular_mlp'"),
    "too large": (json.dumps({"inputs": [{"name": "x" * 70_000}]}), "bytes; expected a JSON object"),
    "too deep": ("[" * 40_000 + "]" * 10_000, "nests deeper than the server reads; expected a JSON object"),
    "a number of 5000 digits": ('{"max_batch_size": ' + "9" * 5000 + "}", "is not usable JSON"),
}
"""A config given with a load that is none, and what the refusal says of it."""


@pytest.mark.parametrize("case", sorted(NOT_CONFIGS))
def test_a_config_that_is_not_one_is_invalid_argument_and_changes_nothing(
    stub: pb_grpc.InferenceStub, server: ServerProcess, case: str
) -> None:
    text, says = NOT_CONFIGS[case]
    code, message = status_of(
        lambda: stub.LoadModel(pb.LoadModelRequest(model="tabular_mlp", config_json=text), timeout=60)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT, message
    assert says in message, message
    with (
        triton.InferenceServerClient(server.tcp_address or "") as client,
        pytest.raises(InferenceServerException) as raised,
    ):
        client.load_model("tabular_mlp", config=text, client_timeout=60)
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert says in raised.value.message()
    assert still_serves(stub)


def test_tritonclient_file_uploads_are_refused_models_come_only_from_the_repository(
    server: ServerProcess,
) -> None:
    with (
        triton.InferenceServerClient(server.tcp_address or "") as client,
        pytest.raises(InferenceServerException) as raised,
    ):
        client.load_model(
            "uploaded", config=json.dumps({}), files={"file:1/model.keras": b"\0" * 1024}, client_timeout=60
        )
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'file:1/model.keras' uploads a model file" in raised.value.message()
    assert "only from its repository" in raised.value.message()


def test_another_repository_name_or_parameter_is_invalid_argument(
    kserve: kpb_grpc.GRPCInferenceServiceStub,
) -> None:
    unknown = kpb.RepositoryModelLoadRequest(model_name="multi_io")
    unknown.parameters["poll"].bool_param = True
    calls: dict[str, Callable[[], object]] = {
        "index": lambda: kserve.RepositoryIndex(
            kpb.RepositoryIndexRequest(repository_name="other"), timeout=60
        ),
        "load": lambda: kserve.RepositoryModelLoad(
            kpb.RepositoryModelLoadRequest(repository_name="/etc", model_name="multi_io"), timeout=60
        ),
        "unknown parameter": lambda: kserve.RepositoryModelLoad(unknown, timeout=60),
    }
    statuses = {name: status_of(call) for name, call in calls.items()}
    assert {name: code for name, (code, _) in statuses.items()} == dict.fromkeys(
        calls, grpc.StatusCode.INVALID_ARGUMENT
    )
    assert 'expected "" (this server has one repository' in statuses["load"][1]
    assert "'poll' is not one udfserve reads; expected only 'config'" in statuses["unknown parameter"][1]


def test_a_storm_of_loads_and_unloads_gets_clear_statuses_within_bounded_memory(
    server: ServerProcess, stub: pb_grpc.InferenceStub
) -> None:
    """Several threads, each with ``STORM_WINDOW`` calls under way, load and unload multi_io and
    ask for models the repository or the server does not hold, for ``STORM_S``: every call is OK,
    NOT_FOUND or RESOURCE_EXHAUSTED (too many calls waiting), none a fault; the server keeps
    serving, and its peak memory grows by less than ``RSS_GROWTH_BOUND_BYTES`` (one load and
    unload come first, so that what a first load keeps for good is not counted)."""
    stub.LoadModel(pb.LoadModelRequest(model="multi_io"), timeout=CALL_TIMEOUT_S)
    stub.UnloadModel(pb.UnloadModelRequest(model="multi_io"), timeout=CALL_TIMEOUT_S)
    loads_before = model_loads(server, "multi_io")
    memory = PeakMemory(server.pid)
    calls: list[Callable[[], grpc.Future]] = [
        lambda: stub.LoadModel.future(pb.LoadModelRequest(model="multi_io"), timeout=CALL_TIMEOUT_S),
        lambda: stub.UnloadModel.future(pb.UnloadModelRequest(model="multi_io"), timeout=CALL_TIMEOUT_S),
        lambda: stub.LoadModel.future(pb.LoadModelRequest(model="absent"), timeout=CALL_TIMEOUT_S),
        lambda: stub.UnloadModel.future(pb.UnloadModelRequest(model="never_loaded"), timeout=CALL_TIMEOUT_S),
    ]
    outcomes: Counter[grpc.StatusCode] = Counter()
    unclear: list[tuple[grpc.StatusCode, str]] = []
    lock = threading.Lock()
    end = time.monotonic() + STORM_S

    def storm(seed: int) -> None:
        window = threading.Semaphore(STORM_WINDOW)

        def answered(future: grpc.Future) -> None:
            with lock:
                outcomes[future.code()] += 1
                if future.code() not in CLEAR_STATUSES:
                    unclear.append((future.code(), future.details()))
            window.release()

        i = seed
        while time.monotonic() < end:
            window.acquire()
            calls[i % len(calls)]().add_done_callback(answered)
            i += 1
        for _ in range(STORM_WINDOW):  # until every call of this thread is answered
            window.acquire()

    threads = [threading.Thread(target=storm, args=(seed,)) for seed in range(STORM_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    growth = memory.growth_bytes()
    loads = model_loads(server, "multi_io") - loads_before
    logger.info(
        "storm: %d calls in %.1f s (%s), %d loads of multi_io; server peak RSS growth %.1f MiB",
        sum(outcomes.values()),
        STORM_S,
        {code.name: count for code, count in outcomes.items()},
        loads,
        growth / MIB,
    )
    assert unclear == []
    assert outcomes[grpc.StatusCode.RESOURCE_EXHAUSTED] > 0, outcomes  # the bound on waiting calls held
    assert loads > 0  # the storm loaded the model for real, not only refused
    assert still_serves(stub)
    assert growth <= RSS_GROWTH_BOUND_BYTES


def test_unloading_a_model_while_a_stream_sends_to_it_refuses_its_requests_and_keeps_the_stream(
    stub: pb_grpc.InferenceStub,
) -> None:
    """A stream keeps four batches of sequence_bilstm in flight while another caller unloads the
    model: each batch is answered, with its rows or refused NOT_FOUND or UNAVAILABLE, never as a
    fault; once a batch is refused, the same stream's batch for tabular_mlp is answered."""
    stub.LoadModel(pb.LoadModelRequest(model="sequence_bilstm"), timeout=CALL_TIMEOUT_S)
    lines = batch_of({"lines": np.ones((8, 16, 32), dtype=np.float32)})
    features = batch_of({"features": np.ones((8, 64), dtype=np.float32)})
    outbox: queue.Queue[pb.PredictRequest | None] = queue.Queue()
    batch_ids = iter(range(1, 1_000_000))
    for _ in range(4):
        outbox.put(request("sequence_bilstm", lines, batch_id=next(batch_ids)))
    unloaded: list[tuple[grpc.StatusCode, str]] = []
    unloading = threading.Thread(
        target=lambda: unloaded.append(
            status_of(
                lambda: stub.UnloadModel(
                    pb.UnloadModelRequest(model="sequence_bilstm"), timeout=CALL_TIMEOUT_S
                )
            )
        )
    )
    answers: Counter[grpc.StatusCode] = Counter()
    other_model: list[pb.PredictResponse] = []
    for response in stub.Predict(iter(outbox.get, None), timeout=CALL_TIMEOUT_S):
        if response.batch_id == 0:  # tabular_mlp's batch: the stream's last
            other_model.append(response)
            outbox.put(None)
            continue
        code = grpc.StatusCode.OK if not response.HasField("error") else _code(response.error.code)
        answers[code] += 1
        if code == grpc.StatusCode.OK:
            outbox.put(request("sequence_bilstm", lines, batch_id=next(batch_ids)))
            if answers[code] == 8:
                unloading.start()
        elif sum(answers.values()) - answers[grpc.StatusCode.OK] == 1:  # the first refusal
            outbox.put(request("tabular_mlp", features, batch_id=0))
    unloading.join()
    logger.info("answers to sequence_bilstm's batches: %s", {c.name: n for c, n in answers.items()})
    assert unloaded == [(grpc.StatusCode.OK, "")]
    assert set(answers) <= {grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE}, (
        answers
    )
    assert answers[grpc.StatusCode.OK] >= 8
    assert len(other_model) == 1 and not other_model[0].HasField("error"), other_model


def model_loads(server: ServerProcess, model: str) -> float:
    return metric_value(scrape(server.http_address or ""), "udfserve_model_loads_total", model=model)


def _code(value: int) -> grpc.StatusCode:
    return next(code for code in grpc.StatusCode if code.value[0] == value)

"""A text model whose tokenizer panics fails that load or that request, with a status and a
reason, and nothing else: the other models load and answer, the server is ready and stops.

The ``tokenizers`` library raises a panic of its Rust code as ``PanicException``, a
``BaseException`` that ``except Exception`` lets through. Both files are the example text
classifier's real tokenizer, edited (``tokenizer_files``): one whose normalizer regex gives up on
a 41-byte text and panics then, one whose ``precompiled_charsmap`` panics when the file is read.
Before, the first left the request unanswered and the model wedged (its only batch slot never
given back), and the second left its model loading for ever and the models after it unloaded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
from model_control_client import EXPLICIT, index_states, status_of
from onnx_graphs import scored_graph, scored_inputs, write_model
from server_harness import Answer, batch_of, http_json, request, running_server, stream_predict
from tokenizer_files import (
    PANICKING_TEXT,
    example_tokenizer,
    with_backtracking_normalizer,
    with_corrupt_charsmap,
    write_text_model,
)

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess, launch_server

ANSWER_TIMEOUT_S = 30.0
"""How long a request may take; the models here answer in milliseconds (a loaded machine aside)."""
READY_TIMEOUT_S = 60.0
"""How long a server of these small models may take to serve."""
GRACE_PERIOD_S = 10.0


@pytest.fixture(scope="module")
def tokenizer() -> dict[str, object]:
    return example_tokenizer()


@pytest.fixture(scope="module")
def panicking_repository(tokenizer: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``reviews`` behind the backtracking normalizer, and ``scored``, a model of numbers."""
    root = tmp_path_factory.mktemp("panicking_text")
    write_text_model(root, "reviews", with_backtracking_normalizer(tokenizer))
    write_model(root, "scored", scored_graph())
    return root


@pytest.fixture(scope="module")
def corrupt_repository(tokenizer: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``broken_charsmap`` behind the corrupt charsmap, and after it (by name) ``scored``."""
    root = tmp_path_factory.mktemp("corrupt_charsmap")
    write_text_model(root, "broken_charsmap", with_corrupt_charsmap(tokenizer))
    write_model(root, "scored", scored_graph())
    return root


@pytest.fixture(scope="module")
def panicking_server(
    panicking_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(
        panicking_repository, socket_dir, tmp_path_factory, "panic", ready_timeout_s=READY_TIMEOUT_S
    ) as process:
        yield process


@pytest.fixture(scope="module")
def corrupt_server(
    corrupt_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(
        corrupt_repository, socket_dir, tmp_path_factory, "charsmap", ready_timeout_s=READY_TIMEOUT_S
    ) as process:
        yield process


@pytest.fixture(scope="module")
def explicit_server(
    corrupt_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Explicit model control, serving ``scored`` alone at start."""
    flags = [*EXPLICIT, "--models", "scored"]
    with running_server(
        corrupt_repository,
        socket_dir,
        tmp_path_factory,
        "charsmap-explicit",
        flags,
        ready_timeout_s=READY_TIMEOUT_S,
    ) as process:
        yield process


def texts(*values: str) -> pa.RecordBatch:
    return pa.record_batch({"text": pa.array(list(values), pa.string())})


def send_panicking_text(target: str) -> Answer | None:
    """The text the tokenizer panics on, sent to ``reviews``: its answer, None when none came."""
    try:
        return stream_predict(
            target, [request("reviews", texts(PANICKING_TEXT))], timeout_s=ANSWER_TIMEOUT_S
        )[0]
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
        return None


def test_a_text_the_tokenizer_panics_on_is_answered_failed_precondition_naming_the_model_and_the_panic(
    panicking_server: ServerProcess,
) -> None:
    answer = send_panicking_text(panicking_server.grpc_target())

    assert answer is not None, f"no answer within {ANSWER_TIMEOUT_S:g} s"
    assert answer.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "model 'reviews'" in answer.message
    assert "tokenizer tokenizer.json panicked" in answer.message
    assert "PanicException" in answer.message


def test_after_a_panic_another_model_answers(panicking_server: ServerProcess) -> None:
    send_panicking_text(panicking_server.grpc_target())

    answer = stream_predict(
        panicking_server.grpc_target(),
        [request("scored", batch_of(scored_inputs(4)))],
        timeout_s=ANSWER_TIMEOUT_S,
    )[0]

    assert answer.outputs is not None, answer.message


def test_after_a_panic_the_text_model_answers_a_normal_text(panicking_server: ServerProcess) -> None:
    send_panicking_text(panicking_server.grpc_target())

    answer = stream_predict(
        panicking_server.grpc_target(),
        [request("reviews", texts("the movie was great", "dull"))],
        timeout_s=ANSWER_TIMEOUT_S,
    )[0]

    assert answer.outputs is not None, answer.message
    tokens = answer.outputs.column("tokens").to_pylist()
    assert tokens[0] > tokens[1] >= 3  # [CLS] dull [SEP]


def test_after_a_panic_the_server_stops_at_once_with_no_batch_running(
    panicking_repository: Path, socket_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    server = launch_server(
        panicking_repository,
        socket=socket_dir / "panic-stop.sock",
        http_port=None,
        extra_args=["--grace-period-s", str(GRACE_PERIOD_S)],
        log_path=log,
        ready_timeout_s=READY_TIMEOUT_S,
    )
    try:
        send_panicking_text(server.grpc_target())
        os.kill(server.pid, signal.SIGTERM)
        signalled_at = time.monotonic()
        exit_code = server.process.wait(timeout=GRACE_PERIOD_S + 20)
        stopped_s = time.monotonic() - signalled_at
    finally:
        server.kill()

    assert exit_code == 0
    assert "batches running" not in log.read_text(errors="replace")
    assert stopped_s < GRACE_PERIOD_S, f"stopped after {stopped_s:.1f} s: it waited out the grace period"


def test_a_tokenizer_that_panics_when_read_fails_its_load_naming_the_file(
    corrupt_server: ServerProcess, corrupt_repository: Path
) -> None:
    status, info = http_json(corrupt_server.http_address or "", "/v1/models/broken_charsmap")

    assert status == 200 and isinstance(info, dict)
    assert info["state"] == "failed" and info["served_versions"] == []
    # named from the repository down: a client reads no path of the server's
    assert (
        "cannot read the tokenizer broken_charsmap/1/tokenizer.json: the tokenizers library panicked"
        in (info["error"])
    )
    assert str(corrupt_repository) not in info["error"]


def test_the_model_after_it_in_the_repository_loads_and_answers(corrupt_server: ServerProcess) -> None:
    answer = stream_predict(
        corrupt_server.grpc_target(),
        [request("scored", batch_of(scored_inputs(4)))],
        timeout_s=ANSWER_TIMEOUT_S,
    )[0]

    assert answer.outputs is not None, answer.message
    assert len(np.asarray(answer.outputs.column("score"))) == 4


def test_the_server_is_ready_with_the_failed_model_listed_with_its_reason(
    corrupt_server: ServerProcess,
) -> None:
    status, readiness = http_json(corrupt_server.http_address or "", "/health/ready")
    ready_file = json.loads(corrupt_server.ready_file.read_text())

    assert status == 200 and isinstance(readiness, dict)
    assert readiness["ready"] is True
    assert readiness["models"] == {"broken_charsmap": "failed", "scored": "ready"}
    assert "the tokenizers library panicked" in readiness["failed"]["broken_charsmap"]
    assert ready_file["models"] == ["scored"] and ready_file["not_serving"] == ""


def test_an_explicit_load_of_it_fails_promptly_with_the_reason(explicit_server: ServerProcess) -> None:
    with grpc.insecure_channel(explicit_server.grpc_target()) as channel:
        stub = pb_grpc.InferenceStub(channel)
        started = time.monotonic()
        code, message = status_of(
            lambda: stub.LoadModel(pb.LoadModelRequest(model="broken_charsmap"), timeout=ANSWER_TIMEOUT_S)
        )
        answered_s = time.monotonic() - started

        assert code == grpc.StatusCode.FAILED_PRECONDITION, message
        assert "cannot read the tokenizer" in message and "the tokenizers library panicked" in message
        assert answered_s < ANSWER_TIMEOUT_S
        assert index_states(stub, "broken_charsmap") == {1: "UNAVAILABLE"}  # failed, not loading

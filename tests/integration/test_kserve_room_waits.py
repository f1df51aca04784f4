"""KServe calls that find their application's share of a model's queue full wait in the server for
room, bounded, as the Arrow stream's requests do (test_room_waits.py): a ModelStreamInfer request
with its stream read no further, a unary call (gRPC ModelInfer on the main port and on the native
port, HTTP infer) while fewer than ``--room-wait-calls`` calls wait, refused at once past them.

The model is the looping ONNX graph (``onnx_graphs.looping_graph``, ``y = 2 * steps`` for one row):
a request of 10**12 steps is a call that holds the model until the server's bound on a model call
(``--model-call-timeout-s``) stops it. One row per batch, a queue of one row per application
(two over all): with that call running and one request of an application queued, the
application's next request finds its share full. Room frees when the bound stops the call; the
tests wait for that event (the answers) and for the server's gauges, never for a time.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.http as triton_http
import yaml
from onnx_graphs import looping_graph, write_model
from server_harness import metric_value, running_server, scrape, wait_for_a_running_call, wait_until_idle
from tritonclient.utils import InferenceServerException

from udfserve.services.model_server.launcher import ServerProcess

MODEL = "looping"
CALL_BOUND_S = 5.0
"""How long the call that holds the model runs: the requests behind it wait that long for room."""
FOR_EVER = 10**12
SAFETY_TIMEOUT_S = 120.0
APP_HEADER = "udfserve-spark-app-id"
QUEUE_FULL = "Exceeds maximum queue size"
WAITED = "for room: the server's --room-wait-s"
"""The words a refusal after a wait for room ends with."""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kserve-room-waits")
    config = {"max_batch_size": 1, "dynamic_batching": {"max_queue_delay_s": 0.001, "max_queue_rows": 1}}
    write_model(root, MODEL, looping_graph(), config=yaml.safe_dump(config))
    return root


def room_server(
    repository: Path,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    room_wait_s: float,
) -> Any:
    """A server whose every KServe surface serves: the python front end on the main port, the
    native one on its own port, HTTP; one unary call may wait for room at a time."""
    flags = [
        "--model-call-timeout-s", str(CALL_BOUND_S),
        "--room-wait-s", str(room_wait_s),
        "--room-wait-calls", "1",
        "--kserve-frontend", "native", "--kserve-port", "0",
        "--kserve-http-port", "0",
    ]  # fmt: skip
    return running_server(repository, socket_dir, tmp_path_factory, name, flags)


@pytest.fixture(scope="module")
def patient(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Requests wait for room far longer than the call that holds the model runs."""
    with room_server(repository, socket_dir, tmp_path_factory, "patient", room_wait_s=60) as process:
        yield process


@pytest.fixture(scope="module")
def impatient(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Requests wait for room 1 s, far less than the call that holds the model runs."""
    with room_server(repository, socket_dir, tmp_path_factory, "impatient", room_wait_s=1) as process:
        yield process


def steps(value: int) -> np.ndarray:
    return np.array([[value]], dtype=np.int64)


def grpc_input(value: int) -> triton.InferInput:
    return triton.InferInput("steps", [1, 1], "INT64").set_data_from_numpy(steps(value))


def admin(server: ServerProcess) -> str:
    assert server.http_address is not None
    return server.http_address


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    return metric_value(scrape(admin(server)), name, **labels)


def wait_for_metric(server: ServerProcess, name: str, value: float, **labels: str) -> None:
    """Until the server's ``name`` reads ``value``: an event of the server, seen from outside."""
    deadline = time.monotonic() + SAFETY_TIMEOUT_S
    while time.monotonic() < deadline:
        if metric(server, name, **labels) == value:
            return
        time.sleep(0.05)  # a short look between scrapes of another process's state
    raise AssertionError(f"{name} {labels} never read {value} (it reads {metric(server, name, **labels)})")


def room_waits(server: ServerProcess) -> float:
    return metric(server, "udfserve_queue_room_wait_seconds_count", model=MODEL)


class Outcomes:
    """Each request's answer, by the name the test gave it: its ``y``, or the refusal's text."""

    def __init__(self) -> None:
        self._received: queue.Queue[tuple[str, float | str]] = queue.Queue()

    def callback(self, name: str) -> Callable[[Any, InferenceServerException | None], None]:
        def received(result: Any, error: InferenceServerException | None) -> None:
            self._received.put(
                (name, error.message() if error is not None else float(result.as_numpy("y")[0, 0]))
            )

        return received

    def put(self, name: str, outcome: float | str) -> None:
        self._received.put((name, outcome))

    def take(self, count: int) -> dict[str, float | str]:
        taken = dict(self._received.get(timeout=SAFETY_TIMEOUT_S) for _ in range(count))
        assert len(taken) == count, f"answers of {count} requests expected, received {taken}"
        return taken


def hold_the_model(server: ServerProcess, client: triton.InferenceServerClient, outcomes: Outcomes) -> None:
    """Start the call that holds the model until its bound stops it, and wait until it runs."""
    wait_until_idle(admin(server), SAFETY_TIMEOUT_S)  # what an earlier test left has been answered
    client.async_infer(MODEL, [grpc_input(FOR_EVER)], outcomes.callback("holder"))
    wait_for_a_running_call(admin(server), SAFETY_TIMEOUT_S)


def stream_burst(server: ServerProcess, values: dict[str, int]) -> tuple[dict[str, float | str], list[str]]:
    """Send ``values`` (name: steps) on one ModelStreamInfer, in order, and take every answer:
    the answered ones by name (their ``y``), and the refusals' texts (a stream's refusal names no
    request)."""
    assert server.tcp_address is not None
    answers: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
    with triton.InferenceServerClient(server.tcp_address) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for name, value in values.items():
                client.async_stream_infer(MODEL, [grpc_input(value)], request_id=name)
            received = [answers.get(timeout=SAFETY_TIMEOUT_S) for _ in values]
        finally:
            client.stop_stream()
    answered = {
        result.get_response().id: float(result.as_numpy("y")[0, 0])
        for result, error in received
        if error is None
    }
    refused = [error.message() for _, error in received if error is not None]
    return answered, refused


# -- ModelStreamInfer ----------------------------------------------------------------------------


def test_a_stream_request_past_its_share_waits_for_room_and_is_answered_once_room_frees(
    patient: ServerProcess,
) -> None:
    """The holder runs, ``queued`` fills the application's share, ``waiting`` finds it full: it
    waits (today it was refused at once) and is answered once the holder's bound freed the model."""
    held_before = room_waits(patient)
    answered, refused = stream_burst(patient, {"holder": FOR_EVER, "queued": 1, "waiting": 2})
    assert answered == {"queued": 2.0, "waiting": 4.0}
    assert len(refused) == 1 and "ran past the server's bound" in refused[0], refused
    assert room_waits(patient) == held_before + 1


def test_a_stream_request_whose_wait_expires_is_refused_as_a_full_queue_naming_the_wait(
    impatient: ServerProcess,
) -> None:
    wait_until_idle(admin(impatient), SAFETY_TIMEOUT_S)
    held_before = room_waits(impatient)
    answered, refused = stream_burst(impatient, {"holder": FOR_EVER, "queued": 1, "waiting": 2})
    assert answered == {"queued": 2.0}  # the refused request is not run later: no row twice
    expired = [text for text in refused if WAITED in text]
    assert len(expired) == 1 and expired[0].startswith(QUEUE_FULL), refused
    assert "it waited 1 s" in expired[0]
    assert room_waits(impatient) == held_before + 1


# -- unary calls ---------------------------------------------------------------------------------


class UnaryCalls:
    """Unary inference calls through one KServe surface, answered into ``outcomes``.

    An HTTP call runs on a thread of its own with a client of its own: tritonclient.http's
    ``async_infer`` sends from a gevent greenlet, which runs only while the caller waits on gevent,
    not while the test watches the server's metrics."""

    def __init__(self, surface: str, server: ServerProcess, outcomes: Outcomes) -> None:
        self._surface = surface
        self._outcomes = outcomes
        self._threads: list[threading.Thread] = []
        if surface == "http":
            assert server.kserve_http_address is not None
            self._http_address = server.kserve_http_address
        else:
            target = server.kserve_target() if surface == "native" else server.tcp_address
            assert target is not None and (surface != "native" or server.kserve_address)
            self._grpc = triton.InferenceServerClient(target)

    def send(self, name: str, value: int, app: str) -> None:
        """Send one call of application ``app``, answered in the background."""
        if self._surface == "http":
            thread = threading.Thread(target=self._http_call, args=(name, value, app), name=name)
            thread.start()
            self._threads.append(thread)
        else:
            headers = {APP_HEADER: app}
            self._grpc.async_infer(MODEL, [grpc_input(value)], self._outcomes.callback(name), headers=headers)

    def _http_call(self, name: str, value: int, app: str) -> None:
        try:
            self._outcomes.put(name, float(self._http_infer(value, app).as_numpy("y")[0, 0]))
        except InferenceServerException as exc:
            self._outcomes.put(name, exc.message())

    def _http_infer(self, value: int, app: str) -> Any:
        infer_input = triton_http.InferInput("steps", [1, 1], "INT64")
        infer_input.set_data_from_numpy(steps(value))
        with triton_http.InferenceServerClient(
            self._http_address, network_timeout=SAFETY_TIMEOUT_S
        ) as client:
            return client.infer(MODEL, [infer_input], headers={APP_HEADER: app})

    def refusal_now(self, value: int, app: str) -> InferenceServerException:
        """One call of ``app``, answered before it returns: it must be refused."""
        with pytest.raises(InferenceServerException) as raised:
            if self._surface == "http":
                self._http_infer(value, app)
            else:
                self._grpc.infer(MODEL, [grpc_input(value)], headers={APP_HEADER: app})
        return raised.value

    def close(self) -> None:
        for thread in self._threads:
            thread.join(SAFETY_TIMEOUT_S)
        if self._surface != "http":
            self._grpc.close()


@pytest.mark.parametrize("surface", ["python", "native", "http"])
def test_a_unary_call_past_the_bound_on_waiting_calls_is_refused_at_once_and_the_waiting_one_answered(
    patient: ServerProcess, surface: str
) -> None:
    """With one call allowed to wait: applications ``one`` and ``two`` each have a request queued
    behind the holder; ``one``'s next call waits for room, ``two``'s finds no place to wait and is
    refused at once (while ``one``'s still waits); then every request is answered exactly once."""
    assert patient.tcp_address is not None
    outcomes = Outcomes()
    held_before = room_waits(patient)
    with triton.InferenceServerClient(patient.tcp_address) as holder_client:
        hold_the_model(patient, holder_client, outcomes)
        calls = UnaryCalls(surface, patient, outcomes)
        try:
            calls.send("queued one", 1, app="one")
            wait_for_metric(patient, "udfserve_queued_rows", 1, model=MODEL)
            calls.send("queued two", 2, app="two")
            wait_for_metric(patient, "udfserve_queued_rows", 2, model=MODEL)
            calls.send("waiting one", 3, app="one")
            wait_for_metric(patient, "udfserve_queue_room_waiting_calls", 1)

            refused = calls.refusal_now(4, app="two")
            assert refused.message().startswith(QUEUE_FULL) and WAITED not in refused.message()
            if surface != "http":
                assert refused.status() == "StatusCode.UNAVAILABLE"
            assert metric(patient, "udfserve_queue_room_waiting_calls") == 1  # ``one``'s still waits

            answers = outcomes.take(4)
        finally:
            calls.close()
    assert "ran past the server's bound" in str(answers.pop("holder"))
    assert answers == {"queued one": 2.0, "queued two": 4.0, "waiting one": 6.0}
    assert room_waits(patient) == held_before + 1
    assert metric(patient, "udfserve_queue_room_waiting_calls") == 0


def test_a_unary_call_whose_wait_expires_is_refused_unavailable_in_triton_s_words(
    impatient: ServerProcess,
) -> None:
    assert impatient.tcp_address is not None
    outcomes = Outcomes()
    with triton.InferenceServerClient(impatient.tcp_address) as client:
        hold_the_model(impatient, client, outcomes)
        client.async_infer(MODEL, [grpc_input(1)], outcomes.callback("queued"))
        wait_for_metric(impatient, "udfserve_queued_rows", 1, model=MODEL)
        with pytest.raises(InferenceServerException) as raised:
            client.infer(MODEL, [grpc_input(2)])
        answers = outcomes.take(2)
    assert raised.value.status() == "StatusCode.UNAVAILABLE"
    assert (
        raised.value.message().startswith(QUEUE_FULL) and "it waited 1 s " + WAITED in raised.value.message()
    )
    assert answers["queued"] == 2.0

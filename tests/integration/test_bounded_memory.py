"""A client that never reads its answers, or many callers without the token, cannot make the server
hold more memory than its bounds: the stream stops being read, the unread call is refused before
its message is read, on the main port and on the native KServe front end's own port alike. The
server's peak resident memory during each attack is measured (its peak is reset first) and must
stay within ``RSS_GROWTH_BOUND_BYTES`` of what it held before."""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from idle_stream import IdleStream
from process_memory import MIB, PeakMemory
from server_harness import batch_of, metric_value, module_server, request, scrape, stream_predict
from tritonclient.grpc import service_pb2 as kpb
from tritonclient.grpc import service_pb2_grpc as kpb_grpc

from udfserve.protocol import inference_pb2 as pb
from udfserve.services.model_server.launcher import ServerProcess, launch_server

logger = logging.getLogger(__name__)

RSS_GROWTH_BOUND_BYTES = 64 * MIB
ATTACK_TIMEOUT_S = 300.0
"""Safety limit of one attack; each ends at its event (the stream paused, or every request sent)."""
NEVER_READING_CLIENT = [("grpc.http2.bdp_probe", 0)]
"""A client that never reads keeps its receive window at gRPC's initial 64 KiB (no BDP growth)."""
TOKEN = "bounded-memory-token"
NATIVE = ["--kserve-frontend", "native", "--kserve-port", "0"]
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"

server = module_server(
    "bounded", ["--models", "tabular_mlp"], repository="tabular_onnx_repository", port=None, http_port=0
)


class Requests:
    """``count`` copies of a message for a gRPC client to send; ``sent`` counts those it took."""

    def __init__(self, message: object, count: int) -> None:
        self._message = message
        self._count = count
        self.sent = 0
        self.all_sent = threading.Event()

    def __iter__(self) -> Iterator[object]:
        for _ in range(self._count):
            self.sent += 1
            yield self._message
        self.all_sent.set()


def report(growth_bytes: int) -> int:
    logger.info("server peak RSS growth: %.1f MiB", growth_bytes / MIB)
    return growth_bytes


def paused_streams(process: ServerProcess) -> float:
    return metric_value(scrape(process.http_address or ""), "udfserve_streams_paused")


@contextmanager
def never_reading(process: ServerProcess, method: str, message: object, count: int) -> Iterator[Requests]:
    """A bidirectional stream that sends ``count`` messages and never reads an answer; yields once
    the server stopped reading it (its stream paused) or took every message, and cancels it after."""
    requests = Requests(message, count)
    with grpc.insecure_channel(process.grpc_target(), options=NEVER_READING_CLIENT) as channel:
        call = channel.stream_stream(method)(iter(requests))
        deadline = time.monotonic() + ATTACK_TIMEOUT_S
        while not requests.all_sent.is_set() and paused_streams(process) < 1:
            assert time.monotonic() < deadline, f"the attack on {method} neither paused nor ended"
            requests.all_sent.wait(0.1)  # a look at the server's gauge between waits for the client
        try:
            yield requests
        finally:
            call.cancel()
            logger.info(
                "%s: %d of %d requests sent, stream paused: %s",
                method,
                requests.sent,
                count,
                not requests.all_sent.is_set(),
            )


def test_an_arrow_stream_of_unknown_models_that_never_reads_is_paused_within_bounded_memory(
    server: ServerProcess,
) -> None:
    message = pb.PredictRequest(model="m" * 1024, batch_id=1).SerializeToString()
    memory = PeakMemory(server.pid)
    with never_reading(server, "/udfserve.v1.Inference/Predict", message, 100_000) as requests:
        growth = report(memory.growth_bytes())
        assert paused_streams(server) == 1, f"the server read all {requests.sent} requests of the stream"
        assert growth <= RSS_GROWTH_BOUND_BYTES


def test_an_arrow_stream_of_valid_predictions_that_never_reads_is_paused_within_bounded_memory(
    server: ServerProcess,
) -> None:
    batch = batch_of({"features": np.ones((64, 64), np.float32)})
    message = request("tabular_mlp", batch).SerializeToString()
    memory = PeakMemory(server.pid)
    with never_reading(server, "/udfserve.v1.Inference/Predict", message, 20_000) as requests:
        growth = report(memory.growth_bytes())
        assert paused_streams(server) == 1, f"the server read all {requests.sent} requests of the stream"
        assert growth <= RSS_GROWTH_BOUND_BYTES


def test_a_kserve_stream_of_refused_large_requests_that_never_reads_is_paused_within_bounded_memory(
    server: ServerProcess,
) -> None:
    refused = kpb.ModelInferRequest(model_name="tabular_mlp", id="refused")
    refused.inputs.add(name="features", datatype="FP32", shape=[1, 64])
    refused.raw_input_contents.append(bytes(MIB))  # 1 MiB where one row of 256 bytes is declared
    message = refused.SerializeToString()
    memory = PeakMemory(server.pid)
    with never_reading(
        server, "/inference.GRPCInferenceService/ModelStreamInfer", message, 2_000
    ) as requests:
        growth = report(memory.growth_bytes())
        assert paused_streams(server) == 1, f"the server read all {requests.sent} requests of the stream"
        assert growth <= RSS_GROWTH_BOUND_BYTES


def test_a_client_on_another_stream_is_answered_while_a_stream_that_never_reads_is_paused(
    server: ServerProcess,
) -> None:
    message = pb.PredictRequest(model="unknown", batch_id=1).SerializeToString()
    features = np.ones((4, 64), np.float32)
    with never_reading(server, "/udfserve.v1.Inference/Predict", message, 100_000):
        assert paused_streams(server) == 1
        answers = stream_predict(
            server.grpc_target(),
            [request("tabular_mlp", batch_of({"features": features}), batch_id=i) for i in range(8)],
        )
        assert paused_streams(server) == 1  # still held back: the answers came from elsewhere
    assert sorted(answers) == list(range(8))
    assert all(
        answer.code == grpc.StatusCode.OK and answer.outputs is not None for answer in answers.values()
    )


def launch_token_server(
    tabular_onnx_repository: Path, folder: Path, socket: Path, extra_args: list[str]
) -> ServerProcess:
    (folder / "token").write_text(TOKEN + "\n")
    return launch_server(
        tabular_onnx_repository,
        socket=socket,
        port=None,
        http_port=None,
        extra_args=["--models", "tabular_mlp", "--auth-token-file", str(folder / "token"), *extra_args],
        log_path=folder / "server.log",
    )


@pytest.fixture(scope="module")
def token_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("bounded-token")
    process = launch_token_server(tabular_onnx_repository, folder, socket_dir / "bounded-token.sock", [])
    yield process
    process.terminate()


@pytest.fixture(scope="module")
def native_token_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("bounded-native-token")
    process = launch_token_server(tabular_onnx_repository, folder, socket_dir / "bounded-native.sock", NATIVE)
    yield process
    process.terminate()


def kserve_target(request: pytest.FixtureRequest, frontend: str) -> tuple[ServerProcess, str]:
    """The token server of ``frontend`` and the address its KServe calls go to."""
    if frontend == "python":
        process: ServerProcess = request.getfixturevalue("token_server")
        return process, process.grpc_target()
    process = request.getfixturevalue("native_token_server")
    assert process.kserve_address is not None
    return process, process.kserve_address


def small_infer_request() -> bytes:
    message = kpb.ModelInferRequest(model_name="tabular_mlp")
    message.inputs.add(name="features", datatype="FP32", shape=[2, 64])
    message.raw_input_contents.append(np.ones((2, 64), np.float32).tobytes())
    return message.SerializeToString()


def warm_up(target: str, callers: int) -> None:
    """The first calls of a port start gRPC's threads and their buffers, once for the server's
    life: a round of small calls without the token, so that the peak measured is the attack's."""
    assert set(unauthenticated_attack(target, callers, 1, call_bytes=1024)) == {
        grpc.StatusCode.UNAUTHENTICATED
    }


def own_peak_bytes() -> int:
    """This test process's peak resident memory (the callers' messages are in it)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


UNAUTHENTICATED_CALLERS = 16
CALLS_PER_CALLER = 2
CALL_BYTES = 60 * MIB


def unauthenticated_attack(
    target: str, callers: int, calls_per_caller: int, call_bytes: int = CALL_BYTES
) -> list[grpc.StatusCode]:
    """``callers`` callers without the token, each making ``calls_per_caller`` unary ModelInfer
    calls of ``call_bytes`` one after the other, all at once; every call's status code."""
    large = kpb.ModelInferRequest(model_name="tabular_mlp", raw_input_contents=[bytes(call_bytes)])
    message = large.SerializeToString()
    del large

    def caller(_: int) -> list[grpc.StatusCode]:
        codes = []
        with grpc.insecure_channel(target) as channel:
            infer = channel.unary_unary(MODEL_INFER)
            for _ in range(calls_per_caller):
                try:
                    infer(message, timeout=ATTACK_TIMEOUT_S)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.append(exc.code())
        return codes

    with ThreadPoolExecutor(callers) as pool:
        return [code for caller_codes in pool.map(caller, range(callers)) for code in caller_codes]


@pytest.mark.parametrize("frontend", ["python", "native"])
def test_unary_calls_of_large_messages_without_the_token_are_refused_within_bounded_memory(
    request: pytest.FixtureRequest, frontend: str
) -> None:
    process, target = kserve_target(request, frontend)
    warm_up(target, UNAUTHENTICATED_CALLERS)
    memory = PeakMemory(process.pid)
    started = time.monotonic()
    codes = unauthenticated_attack(target, UNAUTHENTICATED_CALLERS, CALLS_PER_CALLER)
    growth = report(memory.growth_bytes())
    logger.info(
        "%s front end: %d calls in %.1f s; this process's own peak %.0f MiB",
        frontend,
        len(codes),
        time.monotonic() - started,
        own_peak_bytes() / MIB,
    )
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * (UNAUTHENTICATED_CALLERS * CALLS_PER_CALLER)
    assert growth <= RSS_GROWTH_BOUND_BYTES, f"the server's peak grew by {growth / MIB:.0f} MiB"


@pytest.mark.parametrize("frontend", ["python", "native"])
def test_calls_with_the_token_are_served_by_a_server_that_refuses_those_without(
    request: pytest.FixtureRequest, frontend: str
) -> None:
    _, target = kserve_target(request, frontend)
    with grpc.insecure_channel(target) as channel:
        answer = kpb.ModelInferResponse.FromString(
            channel.unary_unary(MODEL_INFER)(
                small_infer_request(),
                metadata=[("authorization", f"Bearer {TOKEN}")],
                timeout=ATTACK_TIMEOUT_S,
            )
        )
    assert [output.name for output in answer.outputs] == ["probabilities"]
    assert list(answer.outputs[0].shape) == [2, 8]


def test_a_stream_of_large_messages_without_the_token_is_refused_within_bounded_memory(
    token_server: ServerProcess,
) -> None:
    large = kpb.ModelInferRequest(model_name="tabular_mlp", raw_input_contents=[bytes(CALL_BYTES)])
    memory = PeakMemory(token_server.pid)
    with grpc.insecure_channel(token_server.grpc_target()) as channel:
        stub = kpb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.ModelStreamInfer(iter([large] * 4), timeout=ATTACK_TIMEOUT_S))
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert report(memory.growth_bytes()) <= RSS_GROWTH_BOUND_BYTES


@pytest.mark.slow
@pytest.mark.parametrize("frontend", ["python", "native"])
def test_the_issues_full_attack_is_refused_within_bounded_memory(
    request: pytest.FixtureRequest, frontend: str
) -> None:
    """The attack of the report at its full scale: 32 callers without the token, 3 unary calls of
    60 MiB each."""
    process, target = kserve_target(request, frontend)
    warm_up(target, 32)
    memory = PeakMemory(process.pid)
    started = time.monotonic()
    codes = unauthenticated_attack(target, 32, 3)
    growth = report(memory.growth_bytes())
    logger.info("%s front end: 96 calls in %.1f s", frontend, time.monotonic() - started)
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 96
    assert growth <= RSS_GROWTH_BOUND_BYTES, f"the server's peak grew by {growth / MIB:.0f} MiB"


CONCURRENT_CALLS = 2


@pytest.fixture(scope="module")
def limited_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = launch_server(
        tabular_onnx_repository,
        socket=socket_dir / "bounded-calls.sock",
        port=None,
        http_port=0,
        extra_args=["--models", "tabular_mlp", "--max-concurrent-calls", str(CONCURRENT_CALLS)],
        log_path=tmp_path_factory.mktemp("bounded-calls") / "server.log",
    )
    yield process
    process.terminate()


def test_calls_beyond_the_concurrent_limit_are_refused_resource_exhausted(
    limited_server: ServerProcess,
) -> None:
    target = limited_server.grpc_target()
    idle = [IdleStream(target) for _ in range(CONCURRENT_CALLS)]
    try:
        deadline = time.monotonic() + ATTACK_TIMEOUT_S
        while (
            metric_value(scrape(limited_server.http_address or ""), "udfserve_streams_active")
            < CONCURRENT_CALLS
        ):
            assert time.monotonic() < deadline, "the idle streams were not taken by the server"
            time.sleep(0.05)
        with grpc.insecure_channel(target) as channel:
            live = channel.unary_unary(
                "/inference.GRPCInferenceService/ServerLive",
                request_serializer=kpb.ServerLiveRequest.SerializeToString,
                response_deserializer=kpb.ServerLiveResponse.FromString,
            )
            calls = [live.future(kpb.ServerLiveRequest(), timeout=ATTACK_TIMEOUT_S) for _ in range(10)]
            while not any(call.done() for call in calls):
                assert time.monotonic() < deadline, "calls beyond the limit were neither refused nor served"
                time.sleep(0.05)
            refused = [call for call in calls if call.done()]
            assert {call.code() for call in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            for stream in idle:
                stream.close()
            idle = []
            # those that waited, unread, in gRPC's queue are served, or refused when they reached
            # the server before it counted the closed streams out: none is left hanging
            waited = {call.code() for call in calls if call not in refused}
            assert waited <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    finally:
        for stream in idle:
            stream.close()


NATIVE_CONCURRENT_CALLS = 2
NATIVE_HELD_BYTES = 64 * MIB
"""The native port's budget: room for one message of --max-message-bytes (64 MiB)."""


@pytest.fixture(scope="module")
def native_limited_server(
    tabular_onnx_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = launch_server(
        tabular_onnx_repository,
        socket=socket_dir / "bounded-native-calls.sock",
        port=None,
        http_port=0,
        extra_args=[
            "--models",
            "tabular_mlp",
            "--max-concurrent-calls",
            str(NATIVE_CONCURRENT_CALLS),
            "--max-unary-held-bytes",
            str(NATIVE_HELD_BYTES),
            "--max-message-bytes",
            str(64 * MIB),
            *NATIVE,
        ],
        log_path=tmp_path_factory.mktemp("bounded-native-calls") / "server.log",
    )
    yield process
    process.terminate()


class UnsentCall:
    """A unary ModelInfer call whose message the client never sends: the server admitted it (it
    counts against the call limit) and, once it has room, reserves the budget for its message."""

    def __init__(self, target: str) -> None:
        self._done = threading.Event()
        self._channel = grpc.insecure_channel(target)
        requests = iter(lambda: self._done.wait() and None, None)  # sends nothing, ends when done
        self._call = self._channel.stream_unary(MODEL_INFER).future(requests, timeout=ATTACK_TIMEOUT_S)

    def close(self) -> None:
        self._call.cancel()
        self._done.set()
        self._channel.close()


def native_bounds(process: ServerProcess) -> tuple[float, float, float]:
    """(calls the native port handles, bytes its budget holds, calls waiting for room)."""
    text = scrape(process.http_address or "")
    return (
        metric_value(text, "udfserve_native_kserve_calls"),
        metric_value(text, "udfserve_native_kserve_held_bytes"),
        metric_value(text, "udfserve_native_kserve_calls_waiting"),
    )


def wait_for_native_bounds(process: ServerProcess, calls: int, held_bytes: int, waiting: int) -> None:
    wanted = (float(calls), float(held_bytes), float(waiting))
    deadline = time.monotonic() + ATTACK_TIMEOUT_S
    while (seen := native_bounds(process)) != wanted:
        assert time.monotonic() < deadline, f"the native port's bounds stayed at {seen}, expected {wanted}"
        time.sleep(0.05)


@contextmanager
def unsent_calls(target: str, count: int) -> Iterator[list[UnsentCall]]:
    calls = [UnsentCall(target) for _ in range(count)]
    try:
        yield calls
    finally:
        for call in calls:
            call.close()


def test_native_calls_beyond_the_concurrent_limit_are_refused_resource_exhausted(
    native_limited_server: ServerProcess,
) -> None:
    target = native_limited_server.kserve_address
    assert target is not None
    with unsent_calls(target, NATIVE_CONCURRENT_CALLS), grpc.insecure_channel(target) as channel:
        # the first reserved the budget for its message, the second waits for room
        wait_for_native_bounds(native_limited_server, NATIVE_CONCURRENT_CALLS, NATIVE_HELD_BYTES, 1)
        live = channel.unary_unary(SERVER_LIVE)
        with pytest.raises(grpc.RpcError) as raised:
            live(kpb.ServerLiveRequest().SerializeToString(), timeout=ATTACK_TIMEOUT_S)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-concurrent-calls 2" in (raised.value.details() or "")
    wait_for_native_bounds(native_limited_server, 0, 0, 0)
    with grpc.insecure_channel(target) as channel:
        answer = channel.unary_unary(SERVER_LIVE)(kpb.ServerLiveRequest().SerializeToString())
    assert kpb.ServerLiveResponse.FromString(answer).live


def test_a_native_call_waits_unread_while_the_budget_is_held_and_is_served_once_it_frees(
    native_limited_server: ServerProcess,
) -> None:
    target = native_limited_server.kserve_address
    assert target is not None
    with grpc.insecure_channel(target) as channel, unsent_calls(target, 1) as (holder,):
        wait_for_native_bounds(native_limited_server, 1, NATIVE_HELD_BYTES, 0)
        waiting = channel.unary_unary(MODEL_INFER).future(small_infer_request(), timeout=ATTACK_TIMEOUT_S)
        wait_for_native_bounds(native_limited_server, 2, NATIVE_HELD_BYTES, 1)
        assert not waiting.done()
        holder.close()
        answer = kpb.ModelInferResponse.FromString(waiting.result())
    assert list(answer.outputs[0].shape) == [2, 8]
    wait_for_native_bounds(native_limited_server, 0, 0, 0)


def test_a_native_call_waiting_for_room_whose_client_leaves_is_dropped_unread(
    native_limited_server: ServerProcess,
) -> None:
    target = native_limited_server.kserve_address
    assert target is not None
    with unsent_calls(target, 1):
        wait_for_native_bounds(native_limited_server, 1, NATIVE_HELD_BYTES, 0)
        with unsent_calls(target, 1):
            wait_for_native_bounds(native_limited_server, 2, NATIVE_HELD_BYTES, 1)
        wait_for_native_bounds(native_limited_server, 1, NATIVE_HELD_BYTES, 0)
    wait_for_native_bounds(native_limited_server, 0, 0, 0)

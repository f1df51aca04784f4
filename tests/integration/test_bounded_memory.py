"""A client that never reads its answers, or many callers without the token, cannot make the server
hold more memory than its bounds: the stream stops being read, the unread call is refused before
its message is read. The server's peak resident memory during each attack is measured (its peak
is reset first) and must stay within ``RSS_GROWTH_BOUND_BYTES`` of what it held before."""

from __future__ import annotations

import logging
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
from server_harness import batch_of, metric_value, module_server, request, scrape, stream_predict
from tritonclient.grpc import service_pb2 as kpb
from tritonclient.grpc import service_pb2_grpc as kpb_grpc

from services.model_server.launcher import ServerProcess, launch_server
from udfserve.protocol import inference_pb2 as pb

logger = logging.getLogger(__name__)

MIB = 1 << 20
RSS_GROWTH_BOUND_BYTES = 64 * MIB
ATTACK_TIMEOUT_S = 300.0
"""Safety limit of one attack; each ends at its event (the stream paused, or every request sent)."""
NEVER_READING_CLIENT = [("grpc.http2.bdp_probe", 0)]
"""A client that never reads keeps its receive window at gRPC's initial 64 KiB (no BDP growth)."""
TOKEN = "bounded-memory-token"

server = module_server("bounded", ["--models", "tabular_mlp"], port=None, http_port=0)


class PeakMemory:
    """The growth of a process's peak resident memory over a block: the peak is reset at start
    (``/proc/<pid>/clear_refs``), so the peak read at the end is the block's own."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        self.start_bytes = self._status_bytes("VmRSS")

    def growth_bytes(self) -> int:
        return self._status_bytes("VmHWM") - self.start_bytes

    def _status_bytes(self, field: str) -> int:
        for line in Path(f"/proc/{self._pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"/proc/{self._pid}/status has no {field}")


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


@pytest.fixture(scope="module")
def token_server(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("bounded-token")
    (folder / "token").write_text(TOKEN + "\n")
    process = launch_server(
        example_repository,
        socket=socket_dir / "bounded-token.sock",
        port=None,
        http_port=None,
        extra_args=["--models", "tabular_mlp", "--auth-token-file", str(folder / "token")],
        log_path=folder / "server.log",
    )
    yield process
    process.terminate()


UNAUTHENTICATED_CALLERS = 16
CALLS_PER_CALLER = 2
CALL_BYTES = 60 * MIB


def test_unary_calls_of_large_messages_without_the_token_are_refused_within_bounded_memory(
    token_server: ServerProcess,
) -> None:
    large = kpb.ModelInferRequest(model_name="tabular_mlp", raw_input_contents=[bytes(CALL_BYTES)])
    message = large.SerializeToString()
    del large

    def caller(_: int) -> list[grpc.StatusCode]:
        codes = []
        with grpc.insecure_channel(token_server.grpc_target()) as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            for _ in range(CALLS_PER_CALLER):
                try:
                    infer(message, timeout=ATTACK_TIMEOUT_S)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.append(exc.code())
        return codes

    memory = PeakMemory(token_server.pid)
    with ThreadPoolExecutor(UNAUTHENTICATED_CALLERS) as pool:
        codes = [
            code for caller_codes in pool.map(caller, range(UNAUTHENTICATED_CALLERS)) for code in caller_codes
        ]
    growth = report(memory.growth_bytes())
    assert len(codes) == UNAUTHENTICATED_CALLERS * CALLS_PER_CALLER
    assert set(codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert growth <= RSS_GROWTH_BOUND_BYTES, f"the server's peak grew by {growth / MIB:.0f} MiB"


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


CONCURRENT_CALLS = 2


@pytest.fixture(scope="module")
def limited_server(
    example_repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = launch_server(
        example_repository,
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

"""Payloads in the node's shared memory: the same answers as inline, files that never outlive a
stream, refusals that name the problem and lose no batch, and a client that truncates, rewrites
or unmaps its file, or fills the tmpfs, failing its own request only."""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest
from server_harness import (
    batch_of,
    metric_value,
    module_server,
    request,
    running_server,
    scrape,
    stream_predict,
)

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import decode_batch
from udfserve.services.model_server.launcher import ServerProcess
from udfserve.shared_memory import DEFAULT_DIRECTORY, write_ipc_into
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.wire.arrow_wire import arrow_stream
from udfserve.spark_client.wire.channels import connect
from udfserve.spark_client.wire.shared_memory import SharedMemoryPayloads
from udfserve.spark_client.wire.transport import HeldBatch, PredictStream

SHM = Path(DEFAULT_DIRECTORY)
MODEL = "tabular_mlp"


def features(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, 64)).astype(np.float32)


@pytest.fixture
def no_files_left_behind(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every shared-memory file this test's clients created is gone once their streams end.

    Only the clients' own files count, recorded as the real ``SharedMemoryPayloads._create`` makes
    them: other processes of the machine (a Spark job, another server's clients) create and remove
    ``udfserve-*.shm`` files in the same folder meanwhile.
    """
    created: list[Path] = []
    create = SharedMemoryPayloads._create

    def recording(payloads: SharedMemoryPayloads, input_room: int, output_room: int) -> Any:
        made = create(payloads, input_room, output_room)
        if made is not None:
            created.append(made.path)
        return made

    monkeypatch.setattr(SharedMemoryPayloads, "_create", recording)
    yield
    assert [path.name for path in created if path.exists()] == []


class PayloadFile:
    """A file written by hand, as a client would: the request at 0, room for the answer after it."""

    def __init__(
        self,
        batch: pa.RecordBatch,
        output_room: int = 1 << 20,
        name: str | None = None,
        input_room: int = 1 << 22,
        directory: Path = SHM,
    ) -> None:
        self.path = directory / (name or f"udfserve-{secrets.token_hex(8)}.shm")
        self.size = input_room + output_room
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(descriptor, self.size)  # no reservation: the answer's room is a hole
        self.memory = mmap.mmap(descriptor, self.size)
        os.close(descriptor)
        self.view = memoryview(self.memory)
        written = write_ipc_into(pa.py_buffer(self.view[:input_room]), batch)
        assert written is not None
        self.input = pb.SharedMemoryRegion(path=str(self.path), offset=0, size=written)
        self.output = pb.SharedMemoryRegion(path=str(self.path), offset=input_room, size=output_room)

    def unmap(self) -> None:
        """What a client that is done with the file does: its mapping gone, only the server's
        descriptor left (the file was closed when it was mapped)."""
        self.view.release()
        self.memory.close()

    def answer(self, response: pb.PredictResponse) -> pa.RecordBatch:
        start = self.output.offset
        return decode_batch(self.view[start : start + response.output_region_bytes].tobytes())

    def remove(self) -> None:
        if self.path.exists():
            self.path.unlink()


def raw_predict(target: str, requests: Sequence[pb.PredictRequest]) -> list[pb.PredictResponse]:
    with grpc.insecure_channel(target) as channel:
        return list(pb_grpc.InferenceStub(channel).Predict(iter(requests), timeout=60))


def in_shared_memory(payload_file: PayloadFile, batch_id: int = 1) -> pb.PredictRequest:
    return pb.PredictRequest(
        model=MODEL, batch_id=batch_id, input_region=payload_file.input, output_region=payload_file.output
    )


def run_stream(target: str, batches: list[pa.RecordBatch], **settings: object) -> tuple[PredictStream, list]:
    config = ClientConfig(**settings)
    channel, _ = connect(target, config, MODEL)
    stream = arrow_stream(channel, target, MODEL, config)
    return stream, [held.result for held in stream.run(HeldBatch(b) for b in batches)]


@pytest.fixture
def payload_file() -> Iterator[PayloadFile]:
    made = PayloadFile(batch_of({"features": features(300)}))
    yield made
    made.remove()


def assert_same_answer(answer: pa.RecordBatch, expected: pa.RecordBatch) -> None:
    """The same answer up to float rounding: a device call's result for a row may differ in its
    last bits with the other rows merged into its batch, which depends on when requests arrive."""
    assert answer.schema == expected.schema and answer.num_rows == expected.num_rows
    for name in answer.schema.names:
        np.testing.assert_allclose(
            np.asarray(answer.column(name).flatten()), np.asarray(expected.column(name).flatten()), atol=1e-6
        )


def unix(server: ServerProcess) -> str:
    return f"unix://{server.unix_socket}"


def test_an_answer_written_into_shared_memory_equals_the_inline_answer(
    server: ServerProcess, payload_file: PayloadFile
) -> None:
    [response] = raw_predict(unix(server), [in_shared_memory(payload_file)])
    assert not response.HasField("error") and response.arrow_ipc == b""
    assert response.output_region_bytes > 0
    inline = stream_predict(unix(server), [request(MODEL, batch_of({"features": features(300)}))])[0]
    assert payload_file.answer(response).equals(inline.outputs)


def test_the_server_unlinks_a_file_once_it_has_opened_it(
    server: ServerProcess, payload_file: PayloadFile
) -> None:
    raw_predict(unix(server), [in_shared_memory(payload_file)])
    assert not payload_file.path.exists()


def test_the_spark_clients_stream_answers_every_batch_in_order_through_shared_memory(
    server: ServerProcess, no_files_left_behind: None
) -> None:
    batches = [batch_of({"features": features(700, seed)}) for seed in range(12)]
    assert server.http_address is not None
    read_before = metric_value(scrape(server.http_address), "udfserve_shared_memory_requests_total")
    stream, shared = run_stream(unix(server), batches, max_in_flight=4)
    _, inline = run_stream(unix(server), batches, max_in_flight=4, shared_memory=False)
    assert [a.num_rows for a in shared] == [700] * 12
    for answer, expected in zip(shared, inline, strict=True):
        # the same rows, computed in batches merged otherwise: equal but for the last float bits
        assert_same_answer(answer, expected)
    assert stream.counters.resent == 0 and stream.counters.answered == 12
    read = metric_value(scrape(server.http_address), "udfserve_shared_memory_requests_total") - read_before
    assert read == 12


def test_answers_taken_from_shared_memory_stay_intact_while_later_batches_reuse_the_files(
    server: ServerProcess,
) -> None:
    batches = [batch_of({"features": features(500, seed)}) for seed in range(10)]
    _, answers = run_stream(unix(server), batches, max_in_flight=2)
    copies = [pa.RecordBatch.from_pylist(a.to_pylist(), schema=a.schema) for a in answers]
    _, again = run_stream(unix(server), list(reversed(batches)), max_in_flight=2)
    assert all(a.equals(c) for a, c in zip(answers, copies, strict=True))
    for answer, expected in zip(answers, reversed(again), strict=True):
        assert_same_answer(answer, expected)


server_without_shared_memory = module_server("shm-off", ["--shared-memory-dir", "off", "--models", MODEL])


def test_a_server_with_shared_memory_off_refuses_it_and_the_client_resends_inline(
    server_without_shared_memory: ServerProcess, no_files_left_behind: None
) -> None:
    batches = [batch_of({"features": features(200, seed)}) for seed in range(6)]
    stream, answers = run_stream(unix(server_without_shared_memory), batches, max_in_flight=3)
    assert [a.num_rows for a in answers] == [200] * 6
    assert 1 <= stream.counters.resent <= 3  # those sent before the first refusal came back
    assert stream.counters.answered == 6


def test_a_refusal_names_the_setting_and_is_flagged_for_resending(
    server_without_shared_memory: ServerProcess, payload_file: PayloadFile
) -> None:
    [response] = raw_predict(unix(server_without_shared_memory), [in_shared_memory(payload_file)])
    assert response.shared_memory_refused
    assert response.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert "--shared-memory-dir off" in response.error.message and "arrow_ipc" in response.error.message
    assert payload_file.path.exists()  # refused files are not touched


def test_shared_memory_over_tcp_is_refused_as_not_on_this_node(
    server: ServerProcess, payload_file: PayloadFile
) -> None:
    assert server.tcp_address is not None and server.http_address is not None
    refused_before = metric_value(scrape(server.http_address), "udfserve_shared_memory_refusals_total")
    [response] = raw_predict(server.tcp_address, [in_shared_memory(payload_file)])
    assert response.shared_memory_refused
    refused = metric_value(scrape(server.http_address), "udfserve_shared_memory_refusals_total")
    assert refused == refused_before + 1
    assert "unix socket only" in response.error.message
    assert payload_file.path.exists()


def test_a_file_outside_the_shared_memory_folder_is_refused_with_the_folder_named(
    server: ServerProcess, tmp_path: Path
) -> None:
    outside = tmp_path / "udfserve-0123456789abcdef.shm"
    outside.write_bytes(b"\0" * 4096)
    region = pb.SharedMemoryRegion(path=str(outside), offset=0, size=100)
    [response] = raw_predict(unix(server), [pb.PredictRequest(model=MODEL, batch_id=1, input_region=region)])
    assert response.shared_memory_refused
    assert str(SHM) in response.error.message and "directly in" in response.error.message
    assert outside.exists()


def test_a_file_named_otherwise_in_the_folder_is_refused_and_left_alone(server: ServerProcess) -> None:
    stranger = PayloadFile(batch_of({"features": features(3)}), name=f"other-{secrets.token_hex(4)}.shm")
    try:
        [response] = raw_predict(unix(server), [in_shared_memory(stranger)])
        assert response.shared_memory_refused
        assert "udfserve-" in response.error.message
        assert stranger.path.exists()
    finally:
        stranger.remove()


def test_a_region_past_the_end_of_its_file_is_invalid_argument_naming_the_range(
    server: ServerProcess, payload_file: PayloadFile
) -> None:
    beyond = pb.SharedMemoryRegion(path=str(payload_file.path), offset=payload_file.size - 10, size=100)
    [response] = raw_predict(unix(server), [pb.PredictRequest(model=MODEL, batch_id=1, input_region=beyond)])
    assert response.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert not response.shared_memory_refused
    assert f"a file of {payload_file.size} bytes" in response.error.message


def test_a_file_shrunk_after_the_server_opened_it_is_invalid_argument_naming_both_sizes(
    server: ServerProcess, payload_file: PayloadFile
) -> None:
    descriptor = os.open(payload_file.path, os.O_RDWR)  # the client's handle, kept past the unlink
    outbox: queue.Queue[pb.PredictRequest | None] = queue.Queue()
    try:
        with grpc.insecure_channel(unix(server)) as channel:
            responses = pb_grpc.InferenceStub(channel).Predict(iter(outbox.get, None), timeout=60)
            outbox.put(in_shared_memory(payload_file, batch_id=1))
            first = next(responses)
            os.ftruncate(descriptor, 4096)
            outbox.put(in_shared_memory(payload_file, batch_id=2))
            second = next(responses)
            outbox.put(None)
            assert list(responses) == []
    finally:
        os.close(descriptor)
    assert not first.HasField("error")
    assert second.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert f"holds 4096 bytes now, {payload_file.size} when this stream opened it" in second.error.message
    assert "expected the file to keep its size while the stream uses it" in second.error.message
    assert_serves_another_client(server)


BIG_ROWS = 1 << 16
"""A request of 16 MiB: 65,536 rows of 64 float32 features."""


def assert_serves_another_client(server: ServerProcess) -> None:
    """The server is up and answers a new client on a channel of its own."""
    assert server.process.poll() is None, f"the server exited with {server.process.returncode}"
    batch = batch_of({"features": features(3)})
    assert stream_predict(unix(server), [request(MODEL, batch)])[0].code == grpc.StatusCode.OK


@contextlib.contextmanager
def open_stream(
    target: str,
) -> Iterator[tuple[queue.Queue[pb.PredictRequest | None], Iterator[pb.PredictResponse]]]:
    """A Predict stream whose requests the test puts in the queue, one at a time."""
    outbox: queue.Queue[pb.PredictRequest | None] = queue.Queue()
    with grpc.insecure_channel(target) as channel:
        yield outbox, pb_grpc.InferenceStub(channel).Predict(iter(outbox.get, None), timeout=120)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.001)  # a short look between checks of a file another process removes


@contextlib.contextmanager
def big_request_being_read(
    server: ServerProcess,
) -> Iterator[tuple[int, PayloadFile, Callable[[], pb.PredictResponse]]]:
    """A 16 MiB request in shared memory that the server has opened (it removed the name) and not
    answered yet: the client's descriptor of its file, the file, and what waits for the answer."""
    big = PayloadFile(batch_of({"features": features(BIG_ROWS)}), output_room=4 << 20, input_room=17 << 20)
    assert big.input.size >= 16 << 20
    descriptor = os.open(big.path, os.O_RDWR)
    try:
        with open_stream(unix(server)) as (outbox, responses):
            outbox.put(in_shared_memory(big))
            wait_until(lambda: not big.path.exists(), f"the server to open {big.path}")
            yield descriptor, big, lambda: next(responses)
            outbox.put(None)
    finally:
        os.close(descriptor)
        big.remove()


def test_a_client_that_truncates_its_16_mib_file_while_the_server_reads_it_fails_only_that_request(
    server: ServerProcess,
) -> None:
    with big_request_being_read(server) as (descriptor, big, answer):
        os.ftruncate(descriptor, 0)
        response = answer()
    assert response.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert f"of {big.path}, which holds 0 bytes now, {big.size} when this stream opened it" in (
        response.error.message
    )
    assert_serves_another_client(server)


def test_a_client_that_rewrites_its_file_while_the_server_reads_it_fails_at_most_that_request(
    server: ServerProcess,
) -> None:
    with big_request_being_read(server) as (descriptor, big, answer):
        os.ftruncate(descriptor, 0)  # the content gone, the file as large as before: all zeros
        os.ftruncate(descriptor, big.size)
        response = answer()
    if response.HasField("error"):  # read after the rewrite: zeros are no Arrow stream
        assert response.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "PredictRequest.input_region" in response.error.message
    else:  # read before it: the batch the server checked is the one it computed
        assert response.output_region_bytes > 0
    assert_serves_another_client(server)


def test_a_client_that_unmaps_its_file_after_sending_still_gets_its_answer(
    server: ServerProcess, payload_file: PayloadFile
) -> None:
    with open_stream(unix(server)) as (outbox, responses):
        outbox.put(in_shared_memory(payload_file))
        payload_file.unmap()
        response = next(responses)
        outbox.put(None)
    assert not response.HasField("error") and response.output_region_bytes > 0
    assert_serves_another_client(server)


def test_a_request_with_both_inline_bytes_and_a_region_is_invalid_argument(
    server: ServerProcess, payload_file: PayloadFile
) -> None:
    both = in_shared_memory(payload_file)
    both.arrow_ipc = request(MODEL, batch_of({"features": features(3)})).arrow_ipc
    [response] = raw_predict(unix(server), [both])
    assert response.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "both arrow_ipc and input_region" in response.error.message


def test_garbage_in_shared_memory_is_invalid_argument_naming_the_region_field(
    server: ServerProcess, payload_file: PayloadFile
) -> None:
    payload_file.view[:64] = b"\x17" * 64
    [response] = raw_predict(unix(server), [in_shared_memory(payload_file)])
    assert response.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "PredictRequest.input_region" in response.error.message


def test_an_answer_too_large_for_its_room_comes_inline(server: ServerProcess) -> None:
    cramped = PayloadFile(batch_of({"features": features(300)}), output_room=256)
    try:
        [response] = raw_predict(unix(server), [in_shared_memory(cramped)])
    finally:
        cramped.remove()
    assert not response.HasField("error") and response.output_region_bytes == 0
    assert decode_batch(response.arrow_ipc).num_rows == 300


server_trusting_uid_185 = module_server(
    "shm-uids", ["--shared-memory-uids", "185", "--models", MODEL], port=0, http_port=0
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def predict_from_file_of_uid_185(server: ServerProcess, payload_file: PayloadFile) -> pb.PredictResponse:
    """The payload file given to uid 185 (an apache/spark executor's user), then sent."""
    os.chown(payload_file.path, 185, -1)
    [response] = raw_predict(unix(server), [in_shared_memory(payload_file)])
    return response


@needs_root
def test_a_file_of_another_user_is_refused_naming_its_uid_and_left_alone(
    server: ServerProcess, payload_file: PayloadFile
) -> None:
    response = predict_from_file_of_uid_185(server, payload_file)
    assert response.shared_memory_refused
    assert "uid 185" in response.error.message and f"(uid {os.geteuid()})" in response.error.message
    assert payload_file.path.exists()


@needs_root
def test_a_file_of_a_user_in_shared_memory_uids_is_answered_as_inline(
    server_trusting_uid_185: ServerProcess, payload_file: PayloadFile
) -> None:
    response = predict_from_file_of_uid_185(server_trusting_uid_185, payload_file)
    assert not response.HasField("error") and response.output_region_bytes > 0
    inline = stream_predict(
        unix(server_trusting_uid_185), [request(MODEL, batch_of({"features": features(300)}))]
    )[0]
    assert payload_file.answer(response).equals(inline.outputs)


needs_mount = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


@pytest.fixture(scope="module")
def small_tmpfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tmpfs of 4 MiB, that a test can fill."""
    folder = tmp_path_factory.mktemp("small-tmpfs")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(folder)])
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {folder}")
    try:
        yield folder.resolve()
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.fixture(scope="module")
def server_on_small_tmpfs(
    small_tmpfs: Path,
    tabular_onnx_repository: Path,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    with running_server(
        tabular_onnx_repository,
        socket_dir,
        tmp_path_factory,
        "shm-small",
        ["--shared-memory-dir", str(small_tmpfs), "--models", MODEL],
    ) as process:
        yield process


def fill(folder: Path) -> None:
    """Write zeros into a file of ``folder`` until its file system is full."""
    descriptor = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with contextlib.suppress(OSError):  # ENOSPC: full
            while os.write(descriptor, bytes(64 << 10)):
                pass
    finally:
        os.close(descriptor)


@needs_mount
def test_an_answer_that_a_full_tmpfs_cannot_take_comes_inline_and_the_server_serves_on(
    server_on_small_tmpfs: ServerProcess, small_tmpfs: Path
) -> None:
    sparse = PayloadFile(
        batch_of({"features": features(300)}), input_room=1 << 20, output_room=1 << 20, directory=small_tmpfs
    )
    try:
        fill(small_tmpfs)  # the answer's room is a hole that the tmpfs has no page left for
        [response] = raw_predict(unix(server_on_small_tmpfs), [in_shared_memory(sparse)])
    finally:
        (small_tmpfs / "filler").unlink()
        sparse.remove()
    assert not response.HasField("error") and response.output_region_bytes == 0
    inline = stream_predict(
        unix(server_on_small_tmpfs), [request(MODEL, batch_of({"features": features(300)}))]
    )[0]
    assert decode_batch(response.arrow_ipc).equals(inline.outputs)
    assert_serves_another_client(server_on_small_tmpfs)

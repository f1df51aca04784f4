"""A server gives back the memory of what it let go, at once:

- a version unloaded, or replaced by a reload, frees its weights: the batcher's parts refer to
  each other and its predict to the model, so the model waited for the garbage collector, and
  three reloads of a large model left the server gigabytes larger for good;
- a call of 1 GiB of intermediates leaves none of it in ONNX Runtime's arena (it kept the peak of
  any call for the life of the session);
- a ``max_batch_size`` of 2^20 does not make the warm-up allocate for 2^20 rows (its warm-up
  alone added 2.1 GB).

Resident memory is read from ``/proc`` of the server process; each bound is far below what is
released (a 200 MB model, a 1 GiB call) and far above the noise of a server's own allocations."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from onnx_graphs import allocating_graph, identity_graph, weighty_graph, write_model
from process_memory import MIB, PeakMemory, resident_bytes
from server_harness import batch_of, request, running_server, stream_predict

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.services.model_server.launcher import ServerProcess

pytestmark = pytest.mark.slow

logger = logging.getLogger(__name__)

WEIGHTY_TABLE_ROWS = 12_500_000
"""16 bytes a row: a model of 200 MB of weights."""
MODEL_BYTES = WEIGHTY_TABLE_ROWS * 16
RESIDENT_BOUND_BYTES = 64 * MIB
"""How far above its level before the load a server may stay once the model is released."""
CALL_TIMEOUT_S = 300.0
"""Safety limit of one call (loads of a 200 MB model take seconds on a busy machine)."""
GIB_OF_FLOATS = 1 << 28
WIDE_MAX_BATCH = 1 << 20


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("released")
    write_model(root, "weighty", weighty_graph(WEIGHTY_TABLE_ROWS))
    write_model(root, "allocating", allocating_graph())
    write_model(
        root, "wide", identity_graph(shape=["batch", 64]), config=f"max_batch_size: {WIDE_MAX_BATCH}\n"
    )
    return root


@pytest.fixture(scope="module")
def server(
    repository: Path, socket_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    flags = ["--model-control", "explicit", "--models", "allocating", "--version-lease-s", "0"]
    with running_server(repository, socket_dir, tmp_path_factory, "released", flags) as process:
        yield process


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[pb_grpc.InferenceStub]:
    with grpc.insecure_channel(server.grpc_target()) as channel:
        yield pb_grpc.InferenceStub(channel)


def load(stub: pb_grpc.InferenceStub, model: str, *, reload: bool = False) -> None:
    stub.LoadModel(pb.LoadModelRequest(model=model, reload=reload), timeout=CALL_TIMEOUT_S)


def unload(stub: pb_grpc.InferenceStub, model: str) -> None:
    stub.UnloadModel(pb.UnloadModelRequest(model=model), timeout=CALL_TIMEOUT_S)


def mib(size: int) -> str:
    return f"{size / MIB:,.0f} MiB"


def test_an_unloaded_and_a_reloaded_version_free_their_memory_at_once(
    server: ServerProcess, stub: pb_grpc.InferenceStub
) -> None:
    before = resident_bytes(server.pid)
    load(stub, "weighty")
    loaded = resident_bytes(server.pid)
    unload(stub, "weighty")
    after_unload = resident_bytes(server.pid)
    load(stub, "weighty")
    reloads = []
    for _ in range(3):
        load(stub, "weighty", reload=True)
        reloads.append(resident_bytes(server.pid))
    unload(stub, "weighty")
    at_end = resident_bytes(server.pid)
    logger.info(
        "resident: %s before, %s loaded, %s unloaded, %s after each of 3 reloads, %s unloaded again",
        mib(before),
        mib(loaded),
        mib(after_unload),
        ", ".join(mib(size) for size in reloads),
        mib(at_end),
    )
    assert loaded - before >= MODEL_BYTES * 3 // 4  # the weights are resident while it serves
    assert after_unload <= before + RESIDENT_BOUND_BYTES
    assert all(size <= loaded + RESIDENT_BOUND_BYTES for size in reloads)
    assert at_end <= before + RESIDENT_BOUND_BYTES


def test_a_call_of_a_gibibyte_leaves_none_of_it_in_the_arena(server: ServerProcess) -> None:
    before = resident_bytes(server.pid)
    batch = batch_of({"n": np.array([GIB_OF_FLOATS], dtype=np.int64)})
    answer = stream_predict(server.grpc_target(), [request("allocating", batch)], timeout_s=CALL_TIMEOUT_S)[0]
    after = resident_bytes(server.pid)
    logger.info("resident: %s before the 1 GiB call, %s after", mib(before), mib(after))
    assert answer.code == grpc.StatusCode.OK, answer.message
    assert after <= before + RESIDENT_BOUND_BYTES


def test_the_warm_up_of_a_model_of_max_batch_size_2_to_the_20_stays_small(
    server: ServerProcess, stub: pb_grpc.InferenceStub
) -> None:
    peak = PeakMemory(server.pid)
    load(stub, "wide")
    growth = peak.growth_bytes()
    unload(stub, "wide")
    logger.info("peak resident growth while loading a model of max_batch_size 2^20: %s", mib(growth))
    assert growth <= 2 * RESIDENT_BOUND_BYTES  # 2^20 rows of 64 floats are 256 MiB in, as much out

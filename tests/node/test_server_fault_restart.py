"""A server whose batcher breaks for good turns NOT_SERVING, exits 70 and is restarted by
``udfserve node``; clients are served again by the new process.

The fault is real, not injected: the server's address space is capped at what it holds now
(``RLIMIT_AS``, set from outside with ``prlimit``), so the batcher cannot start the thread its
first backend call needs (an 8 MiB stack), as when a node runs out of memory or of threads.
The requests before it need no new thread; the fresh process the supervisor starts has no cap.
"""

from __future__ import annotations

import resource
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from node_harness import (
    CHANGE_TIMEOUT_S,
    NodeProcess,
    entry_for,
    http_get,
    kill_if_still_running,
    predict_tabular,
    stop_node,
)

from udfserve.discovery import NodeDiscovery, ServerEntry
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import encode_batch

ROOM_LEFT_BYTES = 2 << 20  # less than a thread's stack: no thread can start, small allocations still can
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def cap_address_space_at_what_it_holds(pid: int) -> None:
    status = Path(f"/proc/{pid}/status").read_text()
    [vm_kib] = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmSize:")]
    _, hard = resource.prlimit(pid, resource.RLIMIT_AS)
    resource.prlimit(pid, resource.RLIMIT_AS, ((vm_kib << 10) + ROOM_LEFT_BYTES, hard))


def one_prediction(channel: grpc.Channel) -> pb.PredictResponse:
    features = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(5 * 64, np.float32)), 64)
    payload = encode_batch(pa.record_batch({"features": features}))
    request = pb.PredictRequest(model="tabular_mlp", batch_id=1, arrow_ipc=payload)
    [answer] = pb_grpc.InferenceStub(channel).Predict(iter([request]), timeout=CHANGE_TIMEOUT_S)
    return answer


def test_a_server_whose_batcher_broke_stops_serving_exits_70_and_serves_again_after_its_restart(
    tabular_onnx_repository: Path, short_dir: Path
) -> None:
    # a grace period longer than the test: the broken server drains until the health stream closes
    extra = ["--restart-backoff-initial-s", "0.2", "--grace-period-s", "600"]
    node = NodeProcess(short_dir / "rt", tabular_onnx_repository, "cpu", extra)
    broken = fresh = ServerEntry(device="cpu")
    try:
        broken = entry_for(node.wait_all_ready(1), "cpu")
        assert broken.pid is not None
        with grpc.insecure_channel(f"unix://{broken.unix_socket}") as channel:
            health = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=CHANGE_TIMEOUT_S
            )
            assert next(health).status == SERVING
            cap_address_space_at_what_it_holds(broken.pid)

            answer = one_prediction(channel)

            assert answer.error.code == grpc.StatusCode.UNAVAILABLE.value[0], answer
            assert next(health).status == NOT_SERVING  # at once, before the drain ends
            failed = (
                "model 'tabular_mlp': its batcher failed (starting a batch failed: RuntimeError: can't start"
            )
            assert failed in answer.error.message
            assert broken.http_address is not None
            status, readiness = http_get(broken.http_address, "/health/ready")
            assert status == 503 and "unrecoverable fault" in readiness, readiness

        def restarted(discovery: NodeDiscovery) -> bool:
            entry = entry_for(discovery, "cpu")
            return entry.state == "ready" and entry.pid != broken.pid

        fresh = entry_for(node.wait_for(restarted, "the server restarted with a new pid"), "cpu")
        assert f"model server on cpu (pid {broken.pid}) exited with code 70" in node.log()
        assert fresh.unix_socket is not None
        predict_tabular(fresh.unix_socket)
    finally:
        try:
            stop_node(node)
        finally:  # a server that never drains must not outlive the test
            node.process.kill()
            for pid in (broken.pid, fresh.pid):
                kill_if_still_running(pid, node.runtime_dir)

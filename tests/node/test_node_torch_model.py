"""``udfserve node`` supervises a server of a PyTorch model as it does any: a repository holding
only ``m/1/model.pt2`` is served on the node's device, and a server killed with SIGKILL is
restarted and answers torch's numbers again."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
from node_harness import NodeProcess, entry_for, kill_if_still_running, stop_node
from torch_programs import IMAGE_SHAPE, conv_net_repository, torch_outputs

from udfserve.discovery import NodeDiscovery, ServerEntry
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc
from udfserve.protocol.arrow_ipc import decode_batch, encode_batch

pytestmark = pytest.mark.slow


def conv_inputs(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    return {
        "image": rng.standard_normal((rows, *IMAGE_SHAPE)).astype(np.float32),
        "offset": rng.integers(0, 5, size=rows).astype(np.int64),
    }


def predicted_probabilities(unix_socket: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    image = pa.array(inputs["image"].reshape(-1))
    for size in reversed(IMAGE_SHAPE):
        image = pa.FixedSizeListArray.from_arrays(image, size)
    payload = encode_batch(pa.record_batch({"image": image, "offset": pa.array(inputs["offset"])}))
    with grpc.insecure_channel(f"unix://{unix_socket}") as channel:
        [answer] = pb_grpc.InferenceStub(channel).Predict(
            iter([pb.PredictRequest(model="m", batch_id=1, arrow_ipc=payload)]), timeout=120
        )
    assert not answer.HasField("error"), answer.error
    column = decode_batch(answer.arrow_ipc).column("probabilities")
    return column.flatten().to_numpy().reshape(len(column), -1)


def test_a_killed_server_of_a_torch_model_is_restarted_and_answers_torchs_numbers(
    tmp_path: Path, short_dir: Path
) -> None:
    repository = conv_net_repository(tmp_path / "repo")
    program = repository / "m" / "1" / "model.pt2"
    inputs = conv_inputs(32)
    expected = torch_outputs(program, inputs)["probabilities"]
    # --models m: the harness names the example model, a later flag wins
    node = NodeProcess(
        short_dir / "rt", repository, "cpu", ["--restart-backoff-initial-s", "0.2", "--models", "m"]
    )
    killed = fresh = ServerEntry(device="cpu")
    try:
        killed = entry_for(node.wait_all_ready(1), "cpu")
        assert killed.pid is not None and killed.unix_socket is not None
        np.testing.assert_allclose(predicted_probabilities(killed.unix_socket, inputs), expected, atol=1e-5)

        os.kill(killed.pid, signal.SIGKILL)

        def restarted(discovery: NodeDiscovery) -> bool:
            entry = entry_for(discovery, "cpu")
            return entry.state == "ready" and entry.pid != killed.pid

        fresh = entry_for(node.wait_for(restarted, "the server restarted with a new pid"), "cpu")
        assert fresh.unix_socket is not None
        np.testing.assert_allclose(predicted_probabilities(fresh.unix_socket, inputs), expected, atol=1e-5)
    finally:
        try:
            stop_node(node)
        finally:
            node.process.kill()
            for pid in (killed.pid, fresh.pid):
                kill_if_still_running(pid, node.runtime_dir)

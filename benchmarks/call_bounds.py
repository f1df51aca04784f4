"""What the bounds on calls cost: requests per second of a server of this tree against one of a
baseline tree (another checkout of udfserve, from after the ``udfserve`` namespace: ``python -m
udfserve`` starts its server), on the same machine, in alternating rounds.

    python -m benchmarks.call_bounds --model-repository /tmp/models --baseline /tmp/udfserve-old

Two loads, each against ``tabular_mlp`` on the unix socket: ``kserve_unary``, unary KServe
``ModelInfer`` calls of ``rows`` rows from ``concurrency`` callers (each call goes through the
unary budget), and ``arrow_stream``, ``streams`` Predict streams with ``in_flight`` requests each
(each request counted by its stream's bounds). The machine's noise moves both servers alike
within a round, so the ratio of their rates is the figure; prints one JSON line per round and the
median ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as kpb

from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol.arrow_ipc import encode_batch
from udfserve.services.model_server.launcher import ServerProcess, launch_server

FEATURES = 64


def _kserve_request(rows: int) -> bytes:
    request = kpb.ModelInferRequest(model_name="tabular_mlp")
    request.inputs.add(name="features", datatype="FP32", shape=[rows, FEATURES])
    request.raw_input_contents.append(np.ones((rows, FEATURES), np.float32).tobytes())
    return request.SerializeToString()


def _arrow_request(rows: int) -> bytes:
    import pyarrow as pa

    values = pa.array(np.ones(rows * FEATURES, np.float32))
    batch = pa.record_batch({"features": pa.FixedSizeListArray.from_arrays(values, FEATURES)})
    return pb.PredictRequest(model="tabular_mlp", arrow_ipc=encode_batch(batch)).SerializeToString()


async def kserve_unary(target: str, rows: int, concurrency: int, duration_s: float) -> float:
    """Calls per second."""
    message = _kserve_request(rows)
    async with grpc.aio.insecure_channel(target) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        deadline = time.perf_counter() + duration_s
        done = 0

        async def caller() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await infer(message)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


async def arrow_stream(target: str, rows: int, streams: int, in_flight: int, duration_s: float) -> float:
    """Requests per second."""
    message = _arrow_request(rows)
    async with grpc.aio.insecure_channel(target) as channel:
        predict = channel.stream_stream("/udfserve.v1.Inference/Predict")
        deadline = time.perf_counter() + duration_s
        done = 0

        async def stream() -> None:
            nonlocal done
            call = predict()
            for _ in range(in_flight):
                await call.write(message)
            while time.perf_counter() < deadline:
                await call.read()
                done += 1
                await call.write(message)
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass

        started = time.perf_counter()
        await asyncio.gather(*(stream() for _ in range(streams)))
        return done / (time.perf_counter() - started)


def _server(tree: Path, repository: Path, socket_dir: Path, name: str, args: Sequence[str]) -> ServerProcess:
    """A server of ``tree``'s code: its folders linked under their package names first on the path
    (scripts/source_tree.py), so ``python -m udfserve`` imports them, not the installed checkout's."""
    linked = socket_dir / f"{name}-tree"
    if not linked.exists():
        subprocess.run(
            [sys.executable, str(tree / "scripts" / "source_tree.py"), str(tree), str(linked)], check=True
        )
    return launch_server(
        repository,
        socket=socket_dir / f"{name}.sock",
        port=None,
        http_port=None,
        extra_args=["--models", "tabular_mlp", *args],
        # PYTHONSAFEPATH: python -m would put its working folder first, and from this checkout import
        # this checkout's udfserve instead of the linked tree's
        env=dict(os.environ, PYTHONPATH=str(linked), PYTHONSAFEPATH="1"),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-repository", type=Path, required=True, help="the example models")
    parser.add_argument("--baseline", type=Path, required=True, help="the tree to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="length of one load (default 5)")
    parser.add_argument("--rows", type=int, default=8, help="rows per request (default 8)")
    parser.add_argument("--concurrency", type=int, default=16, help="unary callers (default 16)")
    parser.add_argument("--streams", type=int, default=4, help="Predict streams (default 4)")
    parser.add_argument("--in-flight", type=int, default=8, help="requests in flight per stream (default 8)")
    parser.add_argument(
        "--current-args", default="", help="extra flags of the current tree's server, space-separated"
    )
    args = parser.parse_args(argv)
    trees = {"baseline": args.baseline.resolve(), "current": Path(__file__).resolve().parent.parent}
    ratios: dict[str, list[float]] = {"kserve_unary": [], "arrow_stream": []}
    with tempfile.TemporaryDirectory(prefix="udfs-bounds-") as folder:
        for round_index in range(args.rounds):
            rates: dict[str, dict[str, float]] = {}
            order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
            for name in order:
                extra = args.current_args.split() if name == "current" else []
                server = _server(trees[name], args.model_repository, Path(folder), name, extra)
                try:
                    target = server.grpc_target()
                    rates[name] = {
                        "kserve_unary": asyncio.run(
                            kserve_unary(target, args.rows, args.concurrency, args.duration_s)
                        ),
                        "arrow_stream": asyncio.run(
                            arrow_stream(target, args.rows, args.streams, args.in_flight, args.duration_s)
                        ),
                    }
                finally:
                    server.terminate()
            for load in ratios:
                ratios[load].append(rates["current"][load] / rates["baseline"][load])
            print(json.dumps({"round": round_index, "rates_per_s": rates}), flush=True)
    print(
        json.dumps({"median_ratio_current_to_baseline": {k: statistics.median(v) for k, v in ratios.items()}})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

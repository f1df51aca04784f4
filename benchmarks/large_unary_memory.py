"""What large authenticated unary calls leave resident in a server, per allocator setting, side
by side in one run.

    python -m benchmarks.large_unary_memory --model-repository /tmp/models --rounds 2

Each variant is a fresh server of ``tabular_mlp`` on the unix socket (or, with
``--kserve-frontend native``, the native front end's port), with
``--max-unary-held-bytes`` of one message (the calls are read one at a time, as the budget
does when it is full). ``calls`` concurrent KServe ``ModelInfer`` calls of ``call_mib`` MiB of
rows each are sent; the figures are the server's resident memory before, its peak during the
calls (its peak reset first through ``/proc/<pid>/clear_refs``), and its resident memory
``settle_s`` after the last answer (a trim runs at most once a second), plus the time the calls
took. Variants, in an order that rotates each round:

- ``launcher``: the launcher's allocator settings (``ALLOCATOR_ENV``), no trimming;
- ``glibc``: glibc's defaults (the launcher's variables set empty), no trimming;
- ``one-arena``: the launcher's settings with ``MALLOC_ARENA_MAX=1``, no trimming;
- ``trim``: the launcher's settings and ``--trim-after-call-bytes`` at its default (the server's
  default);
- ``trim-glibc``, ``trim-one-arena``: trimming with glibc's defaults, or with one arena.

Prints one JSON line per variant and round, then the medians per variant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as kpb

from udfserve.services.model_server.launcher import ServerProcess, launch_server

MIB = 1 << 20
FEATURES = 64
ROW_BYTES = FEATURES * 4
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"

VARIANTS: Mapping[str, tuple[Mapping[str, str], Sequence[str]]] = {
    "launcher": ({}, ["--trim-after-call-bytes", "0"]),
    "glibc": ({"MALLOC_MMAP_THRESHOLD_": "", "MALLOC_TRIM_THRESHOLD_": ""}, ["--trim-after-call-bytes", "0"]),
    "one-arena": ({"MALLOC_ARENA_MAX": "1"}, ["--trim-after-call-bytes", "0"]),
    "trim": ({}, []),
    "trim-glibc": ({"MALLOC_MMAP_THRESHOLD_": "", "MALLOC_TRIM_THRESHOLD_": ""}, []),
    "trim-one-arena": ({"MALLOC_ARENA_MAX": "1"}, []),
}


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def _request(rows: int) -> bytes:
    request = kpb.ModelInferRequest(model_name="tabular_mlp")
    request.inputs.add(name="features", datatype="FP32", shape=[rows, FEATURES])
    request.raw_input_contents.append(np.ones((rows, FEATURES), np.float32).tobytes())
    return request.SerializeToString()


async def _calls(target: str, message: bytes, calls: int) -> None:
    options = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        infer = channel.unary_unary(MODEL_INFER)
        await asyncio.gather(*(infer(message) for _ in range(calls)))


def measure(server: ServerProcess, message: bytes, calls: int, settle_s: float) -> dict[str, float]:
    target = server.kserve_address or server.grpc_target()
    asyncio.run(_calls(target, _request(8), 1))  # the model and the channel warm
    before = _status_bytes(server.pid, "VmRSS")
    Path(f"/proc/{server.pid}/clear_refs").write_text("5")
    started = time.perf_counter()
    asyncio.run(_calls(target, message, calls))
    seconds = time.perf_counter() - started
    peak = _status_bytes(server.pid, "VmHWM")
    time.sleep(settle_s)
    after = _status_bytes(server.pid, "VmRSS")
    return {
        "rss_before_mib": before / MIB,
        "peak_growth_mib": (peak - before) / MIB,
        "left_resident_mib": (after - before) / MIB,
        "calls_s": seconds,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-repository", type=Path, required=True, help="the example models")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over every variant (default 2)")
    parser.add_argument("--calls", type=int, default=8, help="concurrent calls (default 8)")
    parser.add_argument("--call-mib", type=int, default=60, help="size of each call (default 60)")
    parser.add_argument(
        "--settle-s", type=float, default=3.0, help="wait before the last reading (default 3)"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: all)")
    parser.add_argument(
        "--kserve-frontend",
        choices=["python", "native"],
        default="python",
        help="the front end the calls go to (native: its own port; default python, the unix socket)",
    )
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; expected some of {sorted(VARIANTS)}")
    message = _request(args.call_mib * MIB // ROW_BYTES)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="udfs-large-unary-") as folder:
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                env_overrides, server_args = VARIANTS[name]
                server = launch_server(
                    args.model_repository,
                    socket=Path(folder) / f"{name}.sock",
                    port=None,
                    http_port=None,
                    extra_args=[
                        "--models",
                        "tabular_mlp",
                        "--max-message-bytes",
                        str(len(message) + MIB),
                        "--max-unary-held-bytes",
                        str(len(message) + MIB),
                        *server_args,
                        *(
                            ["--kserve-frontend", "native", "--kserve-port", "0"]
                            if args.kserve_frontend == "native"
                            else []
                        ),
                    ],
                    env={**os.environ, **env_overrides},
                )
                try:
                    figures = measure(server, message, args.calls, args.settle_s)
                finally:
                    server.terminate()
                results[name].append(figures)
                print(json.dumps({"round": round_index, "variant": name, **figures}), flush=True)
    for name, rounds in results.items():
        medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        print(json.dumps({"variant": name, "median": medians}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

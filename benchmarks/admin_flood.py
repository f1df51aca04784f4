"""Authenticated predictions a second with and without a flood of the HTTP admin app, side by side.

One server (``tabular_mlp``, ``--auth-token``), one prediction client (closed-loop streams of
small requests carrying the token) and one flooding client: keep-alive connections asking
``/metrics`` (with the token: a scraper gone wild, whose pages are rendered) and
``/health/live`` back to back, as fast as the server answers. Both clients run in processes of
their own for the whole measurement, and the flood is on in every other window of
``--window-s`` seconds (off, on, off, on, ...): on a shared machine the load of other work drifts
over seconds, and adjacent windows see nearly the same, so each "on" window is compared with the
"off" window just before it. First with one tracked Spark application, then with ``--apps``
of them (each adds series to every ``/metrics`` page).

    python -m benchmarks.admin_flood                  # 12 pairs of 3 s windows, 512 applications
    python -m benchmarks.admin_flood --pairs 4 --apps 64

Prints a Markdown table: predictions a second with the flood off and on (means over the
windows), the median and range of the on/off ratios of the pairs, and what the flood was
answered (200, 429, other) while on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

TOKEN = "admin-flood-bench-token"
MODEL = "tabular_mlp"
ROWS = 8
APP_KEY = "udfserve-spark-app-id"
APP_NAME_KEY = "udfserve-spark-app-name"
START_DELAY_S = 5.0
"""Between starting the clients and the first window: their imports and connections."""


def window_of(at: float, start_at: float, window_s: float) -> int:
    """The window a moment falls in: 0, 1, 2, ...; odd windows are flooded; -1 before the start."""
    return int((at - start_at) // window_s) if at >= start_at else -1


# -- the prediction client (a child process) ---------------------------------------------------------
async def _predict(
    target: str, start_at: float, windows: int, window_s: float, streams: int
) -> dict[str, Any]:
    """Predictions answered per window, from ``start_at`` (wall clock) for ``windows`` windows."""
    import grpc

    from udfserve.protocol import inference_pb2 as pb
    from udfserve.protocol import inference_pb2_grpc as pb_grpc
    from udfserve.protocol.arrow_ipc import encode_batch

    payload = encode_batch(_batch())
    metadata = (("authorization", f"Bearer {TOKEN}"), (APP_KEY, "app-bench-load"), (APP_NAME_KEY, "load"))
    answered = [0] * windows
    failures: Counter[str] = Counter()
    stop_at = start_at + windows * window_s

    async def one_stream(stub: Any) -> None:
        call = stub.Predict(metadata=metadata)
        batch_id = 0
        while time.time() < stop_at:
            await call.write(pb.PredictRequest(model=MODEL, batch_id=batch_id, arrow_ipc=payload))
            answer = await call.read()
            window = window_of(time.time(), start_at, window_s)
            if answer.HasField("error"):
                failures[str(answer.error.code)] += 1
            elif 0 <= window < windows:
                answered[window] += 1
            batch_id += 1
        await call.done_writing()
        while await call.read() != grpc.aio.EOF:
            pass

    async with grpc.aio.insecure_channel(target) as channel:
        await asyncio.gather(*(one_stream(pb_grpc.InferenceStub(channel)) for _ in range(streams)))
    return {"answered": answered, "failures": dict(failures)}


def _batch() -> Any:
    import pyarrow as pa

    values = np.random.default_rng(0).standard_normal((ROWS, 64), dtype=np.float32)
    return pa.record_batch({"features": pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 64)})


# -- the flooding client (a child process) -------------------------------------------------------------
async def _flood(
    http_address: str,
    start_at: float,
    windows: int,
    window_s: float,
    connections: int,
    paths: Sequence[str] = ("/metrics", "/health/live"),
) -> dict[str, Any]:
    """Flood in the odd windows; the answers by status and window."""
    host, port = http_address.rsplit(":", 1)
    statuses: list[Counter[str]] = [Counter() for _ in range(windows)]
    stop_at = start_at + windows * window_s

    async def one_connection(index: int) -> None:
        request = (
            f"GET {paths[index % len(paths)]} HTTP/1.1\r\nHost: {http_address}\r\n"
            f"Authorization: Bearer {TOKEN}\r\n\r\n"
        ).encode()
        reader = writer = None
        while (now := time.time()) < stop_at:
            window = window_of(now, start_at, window_s)
            if window % 2 == 0 or window < 0:  # off: wait for the next window
                await asyncio.sleep(start_at + (window + 1) * window_s - now)
                continue
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, int(port))
                assert reader is not None
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (x.partition(":") for x in lines[1:])
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                statuses[window][lines[0].split(" ")[1]] += 1
                if any(x.lower() == "connection: close" for x in lines[1:]):
                    writer.close()
                    writer = None
            except (OSError, asyncio.IncompleteReadError):
                statuses[window]["closed"] += 1
                if writer is not None:
                    writer.close()
                writer = None
        if writer is not None:
            writer.close()

    await asyncio.gather(*(one_connection(i) for i in range(connections)))
    return {"answered": [dict(counts) for counts in statuses]}


def _child(kind: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    from benchmarks.processes import child_env

    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.admin_flood", "--child", kind, json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def _result(process: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    stdout, stderr = process.communicate(timeout=timeout_s)
    if process.returncode != 0:
        raise RuntimeError(f"a benchmark client failed with exit code {process.returncode}: {stderr[-2000:]}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


# -- the driver ---------------------------------------------------------------------------------------
@dataclass
class Setting:
    """One measurement: predictions per window (even windows quiet, odd flooded), flood answers."""

    apps: int
    window_s: float
    predictions: list[int]
    flood_answers: list[dict[str, int]]


def _track_apps(target: str, apps: int) -> None:
    """One prediction for each of ``apps`` Spark applications, so that the server tracks them all."""
    import grpc

    from udfserve.protocol import inference_pb2 as pb
    from udfserve.protocol import inference_pb2_grpc as pb_grpc
    from udfserve.protocol.arrow_ipc import encode_batch

    payload = encode_batch(_batch())
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.InferenceStub(channel)
        for i in range(apps):
            metadata = (
                ("authorization", f"Bearer {TOKEN}"),
                (APP_KEY, f"app-20261125093000-{i:04d}"),
                (APP_NAME_KEY, f"nightly scoring job {i}"),
            )
            for _ in stub.Predict(
                iter([pb.PredictRequest(model=MODEL, arrow_ipc=payload)]), metadata=metadata
            ):
                pass


def run(
    pairs: int,
    window_s: float,
    apps: int,
    streams: int,
    connections: int,
) -> list[Setting]:
    from benchmarks.processes import Workspace
    from udfserve.services.model_server.config import MAX_TRACKED_APPS

    settings: list[Setting] = []
    windows = 2 * pairs
    with Workspace("udfsb-admin-") as workspace:
        repository = workspace.repository("flood", {MODEL: {}})
        server = workspace.start_server(
            repository,
            "admin-flood",
            ["--auth-token", TOKEN, "--max-tracked-apps", str(min(apps, MAX_TRACKED_APPS))],
        )
        target = server.grpc_target()
        for tracked in (1, apps):
            _track_apps(target, tracked - 1)  # the load's own application is the last one
            timing = {"start_at": time.time() + START_DELAY_S, "windows": windows, "window_s": window_s}
            flood = _child(
                "flood", {"http_address": server.http_address, "connections": connections, **timing}
            )
            load = _child("predict", {"target": target, "streams": streams, **timing})
            timeout_s = START_DELAY_S + windows * window_s + 300
            predicted = _result(load, timeout_s)
            flooded = _result(flood, timeout_s)
            settings.append(Setting(tracked, window_s, predicted["answered"], flooded["answered"]))
            logger.info("%s", settings[-1])
    return settings


def table(settings: Sequence[Setting]) -> str:
    lines = [
        "| tracked apps | predictions/s, flood off | predictions/s, flood on | on / off (median of "
        "pairs, range) | flood answered /s while on |",
        "|---:|---:|---:|---:|---|",
    ]
    for setting in settings:
        rates = [count / setting.window_s for count in setting.predictions]
        off, on = rates[0::2], rates[1::2]
        ratios = sorted(b / a for a, b in zip(off, on, strict=True) if a > 0)
        answered: Counter[str] = Counter()
        for counts in setting.flood_answers[1::2]:
            answered.update(counts)
        seconds = setting.window_s * len(on)
        flood_text = ", ".join(f"{k}: {v / seconds:,.0f}" for k, v in sorted(answered.items())) or "-"
        lines.append(
            f"| {setting.apps} | {statistics.mean(off):,.0f} | {statistics.mean(on):,.0f} | "
            f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f}) | {flood_text} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=12, help="off/on window pairs per setting (default 12)")
    parser.add_argument("--window-s", type=float, default=3.0, help="length of each window (default 3)")
    parser.add_argument(
        "--apps", type=int, default=512, help="tracked Spark applications of the second setting (default 512)"
    )
    parser.add_argument(
        "--streams", type=int, default=4, help="prediction streams, one request in flight each (default 4)"
    )
    parser.add_argument(
        "--connections", type=int, default=16, help="flooding keep-alive connections (default 16)"
    )
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, spec = args.child[0], json.loads(args.child[1])
        result = asyncio.run(_predict(**spec) if kind == "predict" else _flood(**spec))
        print(json.dumps(result))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    settings = run(args.pairs, args.window_s, args.apps, args.streams, args.connections)
    print(table(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())

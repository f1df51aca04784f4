"""gRPC predictions a second with and without a flood of KServe HTTP inference, side by side.

One server (``tabular_mlp``, or ``--model sequence_bilstm``, whose calls take longer: the model,
not the handling of requests, is then what they share) with its KServe HTTP port
(``--kserve-http-port``), one prediction client (closed-loop Arrow ``Predict`` streams of small
requests, as a Spark application: its own flow in the model's fair queue) and one flooding client:
keep-alive connections sending KServe inference requests back to back, as fast as the server
answers. Both clients run in processes of their own for the whole measurement, and the flood is on
in every other window of ``--window-s`` seconds (off, on, off, on, ...): each "on" window is
compared with the "off" window just before it, which the machine's other work moves alike.

Settings, each with a server of its own per placement of the HTTP port:

- HTTP flood (binary tensor data, then JSON tensors) with the port on the serving loop
  (``--kserve-http-loop serving``) and on a thread of its own (``own``);
- the same requests sent as gRPC ``ModelInfer`` calls instead (the reference: what the same
  load costs the predictions when it comes over the gRPC front end).

    python -m benchmarks.kserve_http_flood                  # 10 pairs of 2 s windows a setting
    python -m benchmarks.kserve_http_flood --pairs 3 --window-s 1

Prints a Markdown table: predictions a second with the flood off and on (means over the windows),
the median and range of the on/off ratios of the pairs, the flood's answers a second while on, and
the predictions lost per flood answer (what one flood request costs the predictions: a flood that is
answered faster takes more in all, so protocols compare by this).
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
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.admin_flood import window_of

logger = logging.getLogger(__name__)

MODEL_INPUTS = {"tabular_mlp": ("features", (64,)), "sequence_bilstm": ("lines", (16, 32))}
"""The models a run may take (``--model``): their input, and its per-row shape."""
ROWS = 8
APP_KEY = "udfserve-spark-app-id"
START_DELAY_S = 5.0
"""Between starting the clients and the first window: their imports and connections."""


def _values(model: str, rows: int) -> tuple[str, np.ndarray]:
    """The model's input name and ``rows`` rows of it."""
    name, shape = MODEL_INPUTS[model]
    return name, np.random.default_rng(0).standard_normal((rows, *shape), dtype=np.float32)


# -- the prediction client (a child process) ---------------------------------------------------------
async def _predict(
    model: str, target: str, start_at: float, windows: int, window_s: float, streams: int
) -> dict[str, Any]:
    """Arrow predictions answered per window, from ``start_at`` (wall clock) for ``windows`` windows."""
    import grpc
    import pyarrow as pa

    from udfserve.protocol import inference_pb2 as pb
    from udfserve.protocol import inference_pb2_grpc as pb_grpc
    from udfserve.protocol.arrow_ipc import encode_batch

    name, values = _values(model, ROWS)
    flat = pa.array(values.reshape(-1))
    batch = pa.record_batch({name: pa.FixedSizeListArray.from_arrays(flat, values[0].size)})
    payload = encode_batch(batch)
    answered = [0] * windows
    failures: Counter[str] = Counter()
    stop_at = start_at + windows * window_s

    async def one_stream(stub: Any) -> None:
        call = stub.Predict(metadata=((APP_KEY, "app-bench-predictions"),))
        batch_id = 0
        while time.time() < stop_at:
            await call.write(pb.PredictRequest(model=model, batch_id=batch_id, arrow_ipc=payload))
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


# -- the flooding clients (child processes) ----------------------------------------------------------
def http_request(model: str, address: str, body_kind: str, rows: int) -> bytes:
    """One KServe HTTP inference request of ``rows`` rows, as bytes on the wire."""
    name, values = _values(model, rows)
    if body_kind == "binary":
        data = values.tobytes()
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": name,
                        "shape": list(values.shape),
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": len(data)},
                    }
                ],
                "parameters": {"binary_data_output": True},
            }
        ).encode()
        body, extra = head + data, f"Inference-Header-Content-Length: {len(head)}\r\n"
    else:
        body = json.dumps(
            {
                "inputs": [
                    {"name": name, "shape": list(values.shape), "datatype": "FP32", "data": values.tolist()}
                ]
            }
        ).encode()
        extra = ""
    start = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {address}\r\nContent-Length: {len(body)}\r\n"
    return (start + extra + "\r\n").encode() + body


async def _flood_http(
    model: str,
    address: str,
    start_at: float,
    windows: int,
    window_s: float,
    connections: int,
    body_kind: str,
    rows: int,
) -> dict[str, Any]:
    """HTTP inference back to back in the odd windows; the answers by status and window."""
    host, port = address.rsplit(":", 1)
    request = http_request(model, address, body_kind, rows)
    statuses: list[Counter[str]] = [Counter() for _ in range(windows)]
    stop_at = start_at + windows * window_s

    async def one_connection() -> None:
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
            except (OSError, asyncio.IncompleteReadError):
                statuses[window]["closed"] += 1
                if writer is not None:
                    writer.close()
                writer = None
        if writer is not None:
            writer.close()

    await asyncio.gather(*(one_connection() for _ in range(connections)))
    return {"answered": [dict(counts) for counts in statuses]}


async def _flood_grpc(
    model: str, target: str, start_at: float, windows: int, window_s: float, connections: int, rows: int
) -> dict[str, Any]:
    """The same requests as gRPC ``ModelInfer`` calls, ``connections`` at once, in the odd windows."""
    import grpc
    from tritonclient.grpc import service_pb2 as kpb
    from tritonclient.grpc import service_pb2_grpc as kpb_grpc

    name, values = _values(model, rows)
    request = kpb.ModelInferRequest(model_name=model, raw_input_contents=[values.tobytes()])
    request.inputs.add(name=name, datatype="FP32", shape=list(values.shape))
    statuses: list[Counter[str]] = [Counter() for _ in range(windows)]
    stop_at = start_at + windows * window_s

    async def one_caller(stub: Any) -> None:
        while (now := time.time()) < stop_at:
            window = window_of(now, start_at, window_s)
            if window % 2 == 0 or window < 0:
                await asyncio.sleep(start_at + (window + 1) * window_s - now)
                continue
            try:
                await stub.ModelInfer(request)
                statuses[window]["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                statuses[window][exc.code().name] += 1

    async with grpc.aio.insecure_channel(target) as channel:
        stub = kpb_grpc.GRPCInferenceServiceStub(channel)
        await asyncio.gather(*(one_caller(stub) for _ in range(connections)))
    return {"answered": [dict(counts) for counts in statuses]}


def _child(kind: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    from benchmarks.processes import child_env

    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.kserve_http_flood", "--child", kind, json.dumps(spec)],
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

    name: str
    window_s: float
    predictions: list[int]
    flood_answers: list[dict[str, int]]


SETTINGS = (
    ("HTTP, binary tensors", "serving", "http", "binary"),
    ("HTTP, JSON tensors", "serving", "http", "json"),
    ("gRPC ModelInfer (reference)", "serving", "grpc", "binary"),
    ("HTTP, binary tensors", "own", "http", "binary"),
    ("HTTP, JSON tensors", "own", "http", "json"),
)
"""(flood, where the HTTP port runs, protocol of the flood, its body)."""


def run(model: str, pairs: int, window_s: float, streams: int, connections: int, rows: int) -> list[Setting]:
    from benchmarks.processes import Workspace

    settings: list[Setting] = []
    windows = 2 * pairs
    with Workspace("udfsb-khttp-") as workspace:
        repository = workspace.repository("flood", {model: {}})
        for placement in ("serving", "own"):
            server = workspace.start_server(
                repository,
                f"kserve-http-{placement}",
                ["--kserve-http-port", "0", "--kserve-http-loop", placement],
            )
            target = server.grpc_target()
            for name, where, protocol, body_kind in SETTINGS:
                if where != placement:
                    continue
                timing = {
                    "model": model,
                    "start_at": time.time() + START_DELAY_S,
                    "windows": windows,
                    "window_s": window_s,
                }
                if protocol == "http":
                    spec = {"address": server.kserve_http_address, "body_kind": body_kind, **timing}
                    flood = _child("flood_http", {**spec, "connections": connections, "rows": rows})
                else:
                    flood = _child(
                        "flood_grpc",
                        {"target": server.tcp_address, "connections": connections, "rows": rows, **timing},
                    )
                load = _child("predict", {"target": target, "streams": streams, **timing})
                timeout_s = START_DELAY_S + windows * window_s + 300
                predicted = _result(load, timeout_s)
                flooded = _result(flood, timeout_s)
                label = f"{name}, port on the {'serving loop' if placement == 'serving' else 'own thread'}"
                if protocol == "grpc":
                    label = name
                settings.append(Setting(label, window_s, predicted["answered"], flooded["answered"]))
                logger.info("%s", settings[-1])
            workspace.stop_server(server)
    return settings


def table(settings: Sequence[Setting]) -> str:
    lines = [
        "| flood | predictions/s, flood off | predictions/s, flood on | on / off (median of pairs, range) "
        "| flood answered /s while on | predictions lost per flood answer |",
        "|---|---:|---:|---:|---|---:|",
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
        flood_rate = sum(answered.values()) / seconds
        lost = (statistics.mean(off) - statistics.mean(on)) / flood_rate if flood_rate else 0.0
        lines.append(
            f"| {setting.name} | {statistics.mean(off):,.0f} | {statistics.mean(on):,.0f} | "
            f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f}) | {flood_text} "
            f"| {lost:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=10, help="off/on window pairs per setting (default 10)")
    parser.add_argument("--window-s", type=float, default=2.0, help="length of each window (default 2)")
    parser.add_argument(
        "--streams", type=int, default=4, help="prediction streams, one request in flight each (default 4)"
    )
    parser.add_argument("--connections", type=int, default=16, help="flooding connections (default 16)")
    parser.add_argument(
        "--model", choices=sorted(MODEL_INPUTS), default="tabular_mlp", help="the model (default tabular_mlp)"
    )
    parser.add_argument("--rows", type=int, default=ROWS, help=f"rows of a flood request (default {ROWS})")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, spec = args.child[0], json.loads(args.child[1])
        children: dict[str, Callable[..., Coroutine[Any, Any, dict[str, Any]]]] = {
            "predict": _predict,
            "flood_http": _flood_http,
            "flood_grpc": _flood_grpc,
        }
        print(json.dumps(asyncio.run(children[kind](**spec))))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    settings = run(args.model, args.pairs, args.window_s, args.streams, args.connections, args.rows)
    print(table(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())

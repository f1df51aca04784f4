"""Hostile requests against real model servers, over both protocols and both KServe front ends.

Two servers of the example models are started: one with the python KServe front end, one with
the native one (``--kserve-frontend native``). Each target below gets its share of the requests
(``hostile_requests``: valid requests with things wrong, messages that do not parse, random
bytes), sent as raw bytes so that nothing on the client side tidies them up:

- ``arrow``: Predict streams of the python server, 50 requests a stream;
- ``kserve python``: unary calls (inference, metadata, readiness, configuration, statistics);
- ``kserve stream``: ModelStreamInfer streams of 20 requests that parse (one in ten ending with
  one that does not), a quarter of them with Triton's ``triton_grpc_error`` header (the first
  error ends the stream with its status, and the requests after it go unanswered); an error
  answered in ``error_message`` carries no code, so it counts as INTERNAL when it reads as one
  of the server's faults (``INTERNAL_MARKERS``);
- ``kserve native``: unary calls to the native front end's port.

It reports, per target, the status histogram, every INTERNAL or UNKNOWN (bad input must never
get one), calls that did not finish within their deadline (hangs), whether the server process
died (crashes), and the server's RSS before and after. Exit code 1 when any of those is found.

    python -m tests.fuzz.fuzz_servers                    # 12,000 requests, seed 0
    python -m tests.fuzz.fuzz_servers --quick            # 240 requests: the script works
    python -m tests.fuzz.fuzz_servers --requests 40000 --seed 7
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import psutil
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as kpb

from benchmarks.cli import results_dir
from benchmarks.processes import Workspace
from tests.fuzz.hostile_requests import (
    MODELS,
    UNPARSEABLE,
    arrow_request,
    kserve_metadata_call,
    kserve_request,
)
from udfserve.protocol import inference_pb2 as pb
from udfserve.services.model_server.launcher import ServerProcess

logger = logging.getLogger("fuzz_servers")

DEADLINE_S = 60.0
"""A call not answered within this is a hang (the servers answer a bad request in milliseconds)."""
ARROW_PER_STREAM = 50
KSERVE_PER_STREAM = 20
CALL_BAD = {"INTERNAL", "UNKNOWN"}
MESSAGE_LIMIT = 64 << 20
_CODES = {code.value[0]: code.name for code in grpc.StatusCode}


@dataclass
class TargetReport:
    """What one target answered."""

    name: str
    requests: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    internal_or_unknown: list[str] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)
    """The first message received with each status."""
    hangs: int = 0
    crashed: bool = False
    rss_before_mib: float = 0.0
    rss_after_mib: float = 0.0
    seconds: float = 0.0

    def record(self, status: str, detail: str = "") -> None:
        self.requests += 1
        self.statuses[status] += 1
        self.examples.setdefault(status, detail[:300])
        if status == "DEADLINE_EXCEEDED":
            self.hangs += 1
        if status in CALL_BAD and len(self.internal_or_unknown) < 10:
            self.internal_or_unknown.append(detail[:300])

    def as_json(self) -> dict[str, object]:
        """The report as JSON takes it (``asdict`` would turn the Counter's items into keys)."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return {**fields, "statuses": dict(self.statuses), "answered": sum(self.statuses.values())}

    @property
    def failures(self) -> int:
        return self.hangs + int(self.crashed) + sum(self.statuses[code] for code in CALL_BAD)


def _rss_mib(server: ServerProcess) -> float:
    return psutil.Process(server.pid).memory_info().rss / (1 << 20)


def _channel(target: str) -> grpc.Channel:
    options = [
        ("grpc.max_send_message_length", MESSAGE_LIMIT),
        ("grpc.max_receive_message_length", MESSAGE_LIMIT),
    ]
    return grpc.insecure_channel(target, options=options)


def _status(error: grpc.RpcError) -> tuple[str, str]:
    code = error.code()
    return (code.name if code is not None else "UNKNOWN"), (error.details() or "")


def fuzz_arrow(server: ServerProcess, count: int, rng: np.random.Generator, report: TargetReport) -> None:
    with _channel(server.grpc_target()) as channel:
        predict = channel.stream_stream("/udfserve.v1.Inference/Predict")
        while report.requests < count and server.process.poll() is None:
            size = min(ARROW_PER_STREAM, count - report.requests)
            messages = [arrow_request(rng, batch_id) for batch_id in range(size)]
            if rng.random() < 0.1:
                messages[-1] = UNPARSEABLE  # ends the stream INVALID_ARGUMENT
            answered = 0
            try:
                for raw in predict(iter(messages), timeout=DEADLINE_S):
                    response = pb.PredictResponse.FromString(raw)
                    answered += 1
                    if response.HasField("error"):
                        report.record(_CODES.get(response.error.code, "UNKNOWN"), response.error.message)
                    else:
                        report.record("OK")
            except grpc.RpcError as error:
                report.record(*_status(error))
                answered += 1
            report.requests += max(0, size - answered)  # sent after the stream ended: unanswered


def fuzz_kserve_unary(
    server: ServerProcess, count: int, rng: np.random.Generator, report: TargetReport
) -> None:
    with _channel(server.kserve_target()) as channel:
        calls: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        while report.requests < count and server.process.poll() is None:
            if rng.random() < 0.2:
                method, message = kserve_metadata_call(rng)
            else:
                method, message = "ModelInfer", kserve_request(rng)
            call = calls.get(method) or calls.setdefault(
                method, channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            )
            try:
                call(message, timeout=DEADLINE_S)
                report.record("OK")
            except grpc.RpcError as error:
                report.record(*_status(error))


INTERNAL_MARKERS = ("backend failed", "tensorflow failed", "running the batch failed", "see the server log")
"""Words of the server's INTERNAL messages: a stream's ``error_message`` carries no code."""


def _stream_status(error_message: str) -> str:
    """``OK``, ``INTERNAL`` for a message of the server's own faults, else ``error_message``."""
    if not error_message:
        return "OK"
    return "INTERNAL" if any(marker in error_message for marker in INTERNAL_MARKERS) else "error_message"


def _parseable(rng: np.random.Generator) -> bytes:
    """A hostile request that parses: one that does not ends its stream, so a stream gets at most
    one, last."""
    while True:
        message = kserve_request(rng)
        try:
            kpb.ModelInferRequest.FromString(message)
        except DecodeError:
            continue
        return message


def fuzz_kserve_stream(
    server: ServerProcess, count: int, rng: np.random.Generator, report: TargetReport
) -> None:
    with _channel(server.grpc_target()) as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        while report.requests < count and server.process.poll() is None:
            size = min(KSERVE_PER_STREAM, count - report.requests)
            messages = [_parseable(rng) for _ in range(size)]
            if rng.random() < 0.1:
                messages[-1] = UNPARSEABLE  # ends the stream INVALID_ARGUMENT after the answers before
            metadata = [("triton_grpc_error", "true")] if rng.random() < 0.25 else []
            answered = 0
            try:
                for raw in stream(iter(messages), timeout=DEADLINE_S, metadata=metadata):
                    answer = kpb.ModelStreamInferResponse.FromString(raw)
                    answered += 1
                    report.record(_stream_status(answer.error_message), answer.error_message)
            except grpc.RpcError as error:
                report.record(*_status(error))
                answered += 1
            report.requests += max(0, size - answered)


def _workspace_servers(workspace: Workspace) -> Iterator[tuple[str, ServerProcess]]:
    repository = workspace.repository("fuzz", {model: {} for model in MODELS})
    python = workspace.start_server(repository, "fuzz-python")
    native = workspace.start_server(
        repository, "fuzz-native", ["--kserve-frontend", "native", "--kserve-port", "0"]
    )
    yield "python", python
    yield "native", native


def run(workspace: Workspace, requests: int, seed: int) -> list[TargetReport]:
    """Start the two servers in ``workspace`` and send ``requests`` hostile requests in all."""
    servers = dict(_workspace_servers(workspace))
    targets = [
        ("arrow", servers["python"], fuzz_arrow),
        ("kserve python", servers["python"], fuzz_kserve_unary),
        ("kserve stream", servers["python"], fuzz_kserve_stream),
        ("kserve native", servers["native"], fuzz_kserve_unary),
    ]
    share = -(-requests // len(targets))
    reports = []
    for index, (name, server, fuzz) in enumerate(targets):
        rng = np.random.default_rng([seed, index])
        report = TargetReport(name, rss_before_mib=_rss_mib(server))
        started = time.perf_counter()
        fuzz(server, share, rng, report)
        report.seconds = time.perf_counter() - started
        report.crashed = server.process.poll() is not None
        report.rss_after_mib = 0.0 if report.crashed else _rss_mib(server)
        logger.info(
            "%s: %d requests in %.1f s: %s", name, report.requests, report.seconds, dict(report.statuses)
        )
        reports.append(report)
    return reports


def to_markdown(reports: Sequence[TargetReport], seed: int) -> str:
    lines = [
        f"Hostile requests, seed {seed}",
        "",
        "| target | requests sent | statuses received | crashes | hangs | INTERNAL/UNKNOWN "
        "| RSS before -> after (MiB) | statuses |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in reports:
        statuses = ", ".join(f"{code} {count}" for code, count in r.statuses.most_common())
        bad = sum(r.statuses[code] for code in CALL_BAD)
        received = sum(r.statuses.values())
        lines.append(
            f"| {r.name} | {r.requests} | {received} | {int(r.crashed)} | {r.hangs} | {bad} | "
            f"{r.rss_before_mib:.0f} -> {r.rss_after_mib:.0f} | {statuses} |"
        )
    for r in reports:
        for detail in r.internal_or_unknown:
            lines.append(f"- {r.name}: {detail}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=int, default=12_000, help="hostile requests in all (default 12000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random requests (default 0)")
    parser.add_argument("--quick", action="store_true", help="240 requests: checks that the script works")
    parser.add_argument(
        "--output", type=Path, default=None, help="JSON report file (default: results folder)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    requests = 240 if args.quick else args.requests
    with Workspace(prefix="udfsfz-") as workspace:
        reports = run(workspace, requests, args.seed)
    output = args.output or results_dir(args.quick) / "fuzz_servers.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps([r.as_json() for r in reports], indent=2, sort_keys=True))
    print(to_markdown(reports, args.seed))
    print(f"\nwritten to {output}")
    return 1 if any(r.failures for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The ways perf_analyzer reaches a server in the KServe benchmark: one grid per protocol.

Each server listens on several: udfserve's KServe gRPC port (the native front end's, else the
main one) and its HTTP/REST port (``--kserve-http-port``), Triton's gRPC and HTTP ports. System
shared memory goes over the gRPC port: perf_analyzer creates one POSIX object per input and
output under ``/dev/shm`` (udfserve's default ``--shared-memory-dir``, so no server flag is
needed), registers them and names them in every request instead of sending the tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OUTPUT_BYTES_PER_ROW = 8 * 4
"""``tabular_mlp``'s output: 8 FP32 probabilities per row."""


@dataclass(frozen=True)
class Protocol:
    name: str
    """Its name on the command line and in the result files."""
    listener: str
    """Which of a server's addresses it uses: ``grpc`` or ``http``."""
    title: str
    """How the report names it."""
    file_stem: str

    def perf_analyzer_args(self, batch: int) -> list[str]:
        """perf_analyzer's options for this protocol, for requests of ``batch`` rows."""
        if self.name == "shm":
            # The output region must hold a whole answer (the default, 100 KiB, holds 3,200 rows).
            return [
                *("-i", "grpc"),
                "--shared-memory=system",
                f"--output-shared-memory-size={batch * OUTPUT_BYTES_PER_ROW}",
            ]
        return ["-i", self.listener]


PROTOCOLS = {
    "grpc": Protocol("grpc", "grpc", "gRPC", "perf_analyzer"),
    "http": Protocol("http", "http", "HTTP/REST (binary tensor data)", "perf_analyzer-http"),
    "shm": Protocol("shm", "grpc", "gRPC with system shared memory", "perf_analyzer-shm"),
}


def parse_protocols(value: str) -> list[Protocol]:
    """``grpc,http,shm`` (any of them, in the order measured) as protocols."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in PROTOCOLS]
    if unknown or not names:
        raise SystemExit(f"unknown protocol(s) {unknown or value!r}; expected some of {sorted(PROTOCOLS)}")
    return [PROTOCOLS[name] for name in names]


def protocol_names() -> Sequence[str]:
    return list(PROTOCOLS)

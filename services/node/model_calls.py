"""Model control calls for a whole node: ``udfserve models load|unload|index``.

A node runs one server per device; a load or unload call reaches one server. These commands
read the node's discovery file and make the call on every ready server of the node over its
unix socket, one device after the other: a load returns once its versions serve on that device,
so the node never loads on all its devices at once, and every device keeps serving (old
versions) while another loads. Each device's outcome is reported; the command fails when one
device failed, naming it, so a script can call it again (a load of what already serves is a
no-op).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import grpc

from udfserve.discovery import DiscoveryError, ServerEntry, default_discovery_path, read_live_discovery
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol import inference_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

CallMetadata = tuple[tuple[str, str], ...]
ServerCall = Callable[[pb_grpc.InferenceStub, CallMetadata, float], str]
"""A call on one server: its stub, the call's metadata, the timeout; returns what to report."""


@dataclass(frozen=True)
class DeviceOutcome:
    device: str
    ok: bool
    text: str


def call_every_server(
    discovery_file: Path, call: ServerCall, token: str | None, timeout_s: float
) -> list[DeviceOutcome]:
    """``call`` on every ready server of the node, one after the other; raises ``DiscoveryError``
    when the node has no live discovery file or no ready server."""
    discovery = read_live_discovery(discovery_file)
    servers = [entry for entry in discovery.ready_servers() if entry.unix_socket]
    if not servers:
        raise DiscoveryError(
            f"no ready server with a unix socket in {discovery_file} (node {discovery.node or '?'}): "
            f"states {[entry.state for entry in discovery.servers]}"
        )
    metadata: CallMetadata = (("authorization", f"Bearer {token}"),) if token else ()
    return [_call_one(entry, call, metadata, timeout_s) for entry in servers]


def _call_one(
    entry: ServerEntry, call: ServerCall, metadata: CallMetadata, timeout_s: float
) -> DeviceOutcome:
    with grpc.insecure_channel(f"unix://{entry.unix_socket}") as channel:
        try:
            text = call(pb_grpc.InferenceStub(channel), metadata, timeout_s)
        except grpc.RpcError as exc:
            return DeviceOutcome(entry.device, False, f"{exc.code().name}: {exc.details()}")
    return DeviceOutcome(entry.device, True, text)


def load_call(model: str, config_json: str, reload: bool) -> ServerCall:
    def call(stub: pb_grpc.InferenceStub, metadata: CallMetadata, timeout_s: float) -> str:
        request = pb.LoadModelRequest(model=model, config_json=config_json, reload=reload)
        answer = stub.LoadModel(request, metadata=metadata, timeout=timeout_s)
        return f"{model} serves version(s) {list(answer.served_versions)}"

    return call


def unload_call(model: str) -> ServerCall:
    def call(stub: pb_grpc.InferenceStub, metadata: CallMetadata, timeout_s: float) -> str:
        stub.UnloadModel(pb.UnloadModelRequest(model=model), metadata=metadata, timeout=timeout_s)
        return f"{model} unloaded"

    return call


def index_call(ready_only: bool) -> ServerCall:
    def call(stub: pb_grpc.InferenceStub, metadata: CallMetadata, timeout_s: float) -> str:
        index = stub.RepositoryIndex(
            pb.RepositoryIndexRequest(ready_only=ready_only), metadata=metadata, timeout=timeout_s
        )
        lines = []
        for entry in index.models:
            state = pb.VersionState.Name(entry.state).removeprefix("VERSION_STATE_")
            reason = f" ({entry.reason})" if entry.reason else ""
            lines.append(f"{entry.model} {entry.version or '-'} {state}{reason}")
        return "; ".join(lines) or "no model"

    return call


def add_node_call_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every node-wide call takes: where the node is, the token, the time limit."""
    parser.add_argument(
        "--discovery-file",
        type=Path,
        default=None,
        help="the node's discovery file (default: $UDFSERVE_DISCOVERY_FILE, else "
        "<runtime dir>/discovery.json)",
    )
    parser.add_argument(
        "--auth-token-file", type=Path, default=None, help="the servers' token, when they require one"
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="time limit of the call on one device (a load waits for it)",
    )


def run_node_call(args: argparse.Namespace, call: ServerCall, out: TextIO) -> int:
    """Make ``call`` on every device of the node; one line per device to ``out``; 0 when all
    succeeded, 1 when one failed, 2 when the node cannot be reached."""
    discovery_file = args.discovery_file or default_discovery_path(os.environ)
    token = None
    if args.auth_token_file is not None:
        try:
            token = args.auth_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            logger.error("cannot read --auth-token-file %s: %s", args.auth_token_file, exc)
            return 2
    try:
        outcomes = call_every_server(discovery_file, call, token, args.timeout_s)
    except DiscoveryError as exc:
        logger.error("%s", exc)
        return 2
    for outcome in outcomes:
        out.write(f"{outcome.device}: {'' if outcome.ok else 'FAILED '}{outcome.text}\n")
    failed = [outcome.device for outcome in outcomes if not outcome.ok]
    if failed:
        logger.error(
            "the call failed on %d of %d device(s): %s", len(failed), len(outcomes), ", ".join(failed)
        )
        return 1
    return 0

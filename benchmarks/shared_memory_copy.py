"""What reading shared memory by copy costs the server, against reading it through a mapping.

The server reads a request in shared memory with ``preadv`` into memory of its own and writes
the answer with ``pwrite`` (``frontends/arrow/shared_memory.py``), where it used to map the
client's file and use the bytes where they lay: a mapping faults (SIGBUS, the end of the process)
when its client truncates the file or its tmpfs is full. This times, in one process, what the
server does with a request of each size up to the model call, both ways, side by side:

- **mapped** (before): the file mapped once per stream; per request a size check (``fstat``), the
  request's bytes as a view of the mapping, ``decode_batch``, ``batch_to_inputs``, and the answer
  written into the mapping (``write_ipc_into``);
- **copied** (now): ``StreamRegions.read`` (a copy into an aligned buffer), ``decode_batch``,
  ``batch_to_inputs``, and ``StreamRegions.write`` (the answer encoded, then ``pwrite``).

Each also reads every input value once (a sum), as a model does, so that the pages each way
touches are counted: a mapping's are already there, a fresh buffer's may have to be faulted in.
Requests are ``list<float>[64]`` columns, as Spark sends ``array<float>``; answers are
``fixed_size_list<float>[64]`` of the same size (an identity model: the largest answer per row of
the transport comparison). The two ways alternate, round after round; the table gives the median.

With ``--baseline-tree DIR`` (a checkout of a release that still mapped the files) it also runs
the whole path end to end: a server of that tree and a server of this one, each serving the
transport comparison's identity model, and the Spark client's stream through shared memory
(``benchmarks.load_client``, kind ``client_shared_memory``, 4 batches in flight) against each in
turn. *CPU ms per MB* (client and server CPU time per MB of payload moved, both ways) hardly
depends on what else the machine runs; the rate does.

    python -m benchmarks.shared_memory_copy [--rows 4096 --rows 65536] [--rounds 15] [--json FILE]
    git worktree add /tmp/mapped <a commit before the copy>
    python -m benchmarks.shared_memory_copy --baseline-tree /tmp/mapped
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.load_client import LoadSpec, finish, start_in_child
from benchmarks.models import IDENTITY_MODEL, generate_identity_in_child
from benchmarks.processes import MALLOC_KEEPS_MEMORY, ProcessMeter, Workspace
from benchmarks.report import Table
from udfserve.protocol import inference_pb2 as pb
from udfserve.protocol.arrow_ipc import decode_batch
from udfserve.runtime.tensor_conversion import batch_to_inputs
from udfserve.runtime.tensor_spec import TensorSpec
from udfserve.services.model_server.frontends.arrow.shared_memory import StreamRegions
from udfserve.shared_memory import DEFAULT_DIRECTORY, FILE_PREFIX, FILE_SUFFIX, write_ipc_into

FEATURES = 64
INPUTS = (TensorSpec(name="features", dtype="float32", shape=(FEATURES,)),)
DEFAULT_ROWS = (1024, 4096, 16384, 65536)


def _request(rows: int) -> pa.RecordBatch:
    values = np.random.default_rng(rows).normal(size=rows * FEATURES).astype(np.float32)
    offsets = pa.array(np.arange(0, rows * FEATURES + 1, FEATURES, dtype=np.int32))
    return pa.record_batch({"features": pa.ListArray.from_arrays(offsets, pa.array(values))})


def _answer(rows: int) -> pa.RecordBatch:
    values = pa.array(np.ones(rows * FEATURES, dtype=np.float32))
    return pa.record_batch({"y": pa.FixedSizeListArray.from_arrays(values, FEATURES)})


class _PayloadFile:
    """A client's file: the request at 0, room for the answer after it, memory reserved."""

    def __init__(self, directory: Path, batch: pa.RecordBatch, answer_room: int) -> None:
        self.path = directory / f"{FILE_PREFIX}{secrets.token_hex(8)}{FILE_SUFFIX}"
        request_size = batch.nbytes * 2 + (64 << 10)
        self.size = request_size + answer_room
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.posix_fallocate(descriptor, 0, self.size)
        self.memory = mmap.mmap(descriptor, self.size)
        os.close(descriptor)
        written = write_ipc_into(pa.py_buffer(memoryview(self.memory)[:request_size]), batch)
        assert written is not None
        self.request = pb.SharedMemoryRegion(path=str(self.path), offset=0, size=written)
        self.answer = pb.SharedMemoryRegion(path=str(self.path), offset=request_size, size=answer_room)


def _use(inputs: dict[str, np.ndarray]) -> float:
    return float(inputs["features"].sum())


def _mapped(directory: Path, batch: pa.RecordBatch, answer: pa.RecordBatch) -> Callable[[], object]:
    """A request as the server read it through a mapping of the client's file."""
    payload = _PayloadFile(directory, batch, answer.nbytes * 2 + (64 << 10))
    descriptor = os.open(payload.path, os.O_RDWR)
    os.unlink(payload.path)
    view = memoryview(mmap.mmap(descriptor, payload.size))
    request, room = payload.request, payload.answer

    def one() -> object:
        assert os.fstat(descriptor).st_size >= request.offset + request.size
        decoded = decode_batch(pa.py_buffer(view[request.offset : request.offset + request.size]))
        _use(batch_to_inputs(decoded, "identity", INPUTS))
        assert os.fstat(descriptor).st_size >= room.offset + room.size
        return write_ipc_into(pa.py_buffer(view[room.offset : room.offset + room.size]), answer)

    return one


def _copied(directory: Path, batch: pa.RecordBatch, answer: pa.RecordBatch) -> Callable[[], object]:
    """A request as the server reads it now: by copy, the answer written with ``pwrite``."""
    payload = _PayloadFile(directory, batch, answer.nbytes * 2 + (64 << 10))
    regions = StreamRegions(directory.resolve(), max_region_bytes=1 << 30)

    def one() -> object:
        decoded = decode_batch(regions.read(payload.request, "input_region"))
        _use(batch_to_inputs(decoded, "identity", INPUTS))
        return regions.write(payload.answer, "output_region", answer)

    return one


def _time_us(operation: Callable[[], object], min_s: float) -> float:
    operation()
    count, started = 0, time.perf_counter()
    while True:
        operation()
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_s and count >= 5:
            return elapsed / count * 1e6


def measure(directory: Path, rows_list: Sequence[int], rounds: int, min_s: float) -> dict[str, Any]:
    """Median µs per request of each way and size, rounds alternating between the two ways."""
    results: dict[str, Any] = {}
    for rows in rows_list:
        batch, answer = _request(rows), _answer(rows)
        ways = {"mapped": _mapped(directory, batch, answer), "copied": _copied(directory, batch, answer)}
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for round_index in range(rounds):
            order = list(ways) if round_index % 2 == 0 else list(reversed(ways))
            for name in order:
                samples[name].append(_time_us(ways[name], min_s))
        results[str(rows)] = {
            "request_bytes": batch.nbytes,
            "answer_bytes": answer.nbytes,
            "us": {name: statistics.median(values) for name, values in samples.items()},
            "samples_us": samples,
        }
    return results


def table(results: dict[str, Any]) -> Table:
    columns = ["rows", "request MiB", "mapped, µs", "copied, µs", "copied / mapped", "added, µs"]
    made = Table("A request's shared memory, up to the model call: mapped (before) and copied (now)", columns)
    for rows, result in results.items():
        mapped, copied = result["us"]["mapped"], result["us"]["copied"]
        made.rows.append(
            {
                "rows": f"{int(rows):,}",
                "request MiB": result["request_bytes"] / (1 << 20),
                "mapped, µs": mapped,
                "copied, µs": copied,
                "copied / mapped": copied / mapped,
                "added, µs": copied - mapped,
            }
        )
    return made


def end_to_end(baseline_tree: Path, rows_list: Sequence[int], rounds: int, cell_s: float) -> dict[str, Any]:
    """Each server in turn, round after round: median request MB/s and CPU ms per MB."""
    samples: dict[str, dict[str, list[float]]] = {}
    with Workspace(prefix="udfsb-shm-") as workspace:
        repository = workspace.path("identity-repo")
        generate_identity_in_child(
            repository, FEATURES, {"max_batch_size": max(rows_list), "dynamic_batching": {"enabled": False}}
        )
        limits = ["--max-message-bytes", str(256 << 20)]
        servers = {
            "mapped": workspace.start_server(
                repository, "mapped", limits, env={"PYTHONPATH": str(baseline_tree.resolve())}
            ),
            "copied": workspace.start_server(repository, "copied", limits),
        }
        for rows in rows_list:
            for round_index in range(rounds):
                order = list(servers) if round_index % 2 == 0 else list(reversed(servers))
                for name in order:
                    server = servers[name]
                    spec = LoadSpec(
                        target=server.grpc_target(prefer_unix=True),
                        model=IDENTITY_MODEL,
                        kind="client_shared_memory",
                        rows=rows,
                        streams=1,
                        in_flight=4,
                        duration_s=cell_s,
                        max_message_bytes=256 << 20,
                    )
                    meter = ProcessMeter(server.pid)
                    client = start_in_child(spec, MALLOC_KEEPS_MEMORY)
                    meter.start()
                    result = finish(client, spec)
                    usage = meter.stop()
                    megabytes_both_ways = 2 * result.request_bytes / 1e6
                    cell = samples.setdefault(str(rows), {}).setdefault(name, [])
                    cell.append(result.request_bytes / result.wall_s / 1e6)
                    per_mb = samples[str(rows)].setdefault(f"{name} cpu", [])
                    per_mb.append((result.cpu_s + usage.cpu_s) / megabytes_both_ways * 1e3)
    return {
        rows: {key: statistics.median(values) for key, values in cells.items()} | {"samples": cells}
        for rows, cells in samples.items()
    }


def end_to_end_table(results: dict[str, Any]) -> Table:
    columns = [
        "rows",
        "mapped: request MB/s",
        "copied: request MB/s",
        "copied / mapped, rate",
        "mapped: CPU ms per MB",
        "copied: CPU ms per MB",
        "copied / mapped, CPU per MB",
    ]
    made = Table("The Spark client's stream through shared memory, end to end: mapped and copied", columns)
    for rows, result in results.items():
        made.rows.append(
            {
                "rows": f"{int(rows):,}",
                "mapped: request MB/s": result["mapped"],
                "copied: request MB/s": result["copied"],
                "copied / mapped, rate": result["copied"] / result["mapped"],
                "mapped: CPU ms per MB": result["mapped cpu"],
                "copied: CPU ms per MB": result["copied cpu"],
                "copied / mapped, CPU per MB": result["copied cpu"] / result["mapped cpu"],
            }
        )
    return made


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, action="append", help="rows per request (repeatable)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per size, each timing both ways")
    parser.add_argument("--min-s", type=float, default=0.2, help="least time of one timing")
    parser.add_argument("--directory", type=Path, default=Path(DEFAULT_DIRECTORY), help="a tmpfs folder")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="a source tree of a release that mapped the files: also compare the two end to end",
    )
    parser.add_argument("--end-to-end-rounds", type=int, default=3, help="rounds per size end to end")
    parser.add_argument("--cell-s", type=float, default=3.0, help="seconds of one end-to-end cell")
    arguments = parser.parse_args(argv)
    rows_list = arguments.rows or DEFAULT_ROWS
    with tempfile.TemporaryDirectory(dir=arguments.directory) as folder:
        results: dict[str, Any] = {
            "in_process": measure(Path(folder), rows_list, arguments.rounds, arguments.min_s)
        }
    print(table(results["in_process"]).to_markdown())
    if arguments.baseline_tree:
        results["end_to_end"] = end_to_end(
            arguments.baseline_tree, rows_list, arguments.end_to_end_rounds, arguments.cell_s
        )
        print()
        print(end_to_end_table(results["end_to_end"]).to_markdown())
    if arguments.json:
        arguments.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

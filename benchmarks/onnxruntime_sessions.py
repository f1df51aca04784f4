"""How the ONNX Runtime backend should open its sessions and call them, measured side by side.

Two questions of ``udfserve/runtime/backends/onnxruntime*.py``, on the example MLP (64 -> 256 ->
256 -> 8, random weights, ``udfserve.services.examples.onnx_models.dense_stack_graph``):

- **Call path**: ``InferenceSession.run`` with numpy arrays, against ``run_with_ort_values`` over
  ``OrtValue.ortvalue_from_numpy``, against I/O binding (``bind_cpu_input``, an output bound to
  the CPU, ``copy_outputs_to_cpu``), at 64, 1,024 and 4,096 rows per call. On the CPU, ``run``
  already reads a contiguous input in place and returns its outputs over ONNX Runtime's buffers.
- **Concurrent calls** (what the server's ``cpu_parallel`` makes of a large call): 4,096 rows as
  two concurrent 2,048-row calls of one session, against one 4,096-row call, for sessions of one
  intra-op thread per call (the backend's on 2 cores: one core short) and of one per core, in
  sequential and in parallel execution mode.
- **Spinning**: a session whose pool threads spin after a call (ONNX Runtime's default) against
  one that does not (``session.intra_op.allow_spinning=0``), with a pool of two threads: CPU time
  used while calls of 64 rows come every 2 ms (a server between small batches), and rows/s of
  1,024-row calls back to back.

The contenders alternate, round after round, in one process; the table gives medians. Rows/s
depend on what else the machine runs; CPU seconds while idle hardly do.

    python -m benchmarks.onnxruntime_sessions [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort

from udfserve.services.examples.onnx_models import dense_stack_graph

Call = Callable[[np.ndarray], object]


def mlp_bytes() -> bytes:
    rng = np.random.default_rng(0)
    layers = [
        (rng.standard_normal((64, 256)) * 0.1, rng.standard_normal(256) * 0.1, "Relu"),
        (rng.standard_normal((256, 256)) * 0.1, rng.standard_normal(256) * 0.1, "Relu"),
        (rng.standard_normal((256, 8)) * 0.1, rng.standard_normal(8) * 0.1, "Softmax"),
    ]
    graph = dense_stack_graph("mlp", layers, input_name="features", output_name="probabilities")
    return bytes(graph.SerializeToString())


def session(model: bytes, *, threads: int, spinning: bool, parallel: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = threads if parallel else 1
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def call_paths(model: bytes) -> dict[str, Call]:
    plain = session(model, threads=1, spinning=False)

    def run(x: np.ndarray) -> object:
        return plain.run(["probabilities"], {"features": x})[0]

    def ort_values(x: np.ndarray) -> object:
        value = ort.OrtValue.ortvalue_from_numpy(x)
        return plain.run_with_ort_values(["probabilities"], {"features": value})[0].numpy()

    def io_binding(x: np.ndarray) -> object:
        binding = plain.io_binding()
        binding.bind_cpu_input("features", x)
        binding.bind_output("probabilities")
        plain.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]

    return {"run (numpy)": run, "run_with_ort_values": ort_values, "io_binding": io_binding}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rows_per_s(call: Call, x: np.ndarray, seconds: float) -> float:
    call(x)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        call(x)
        calls += 1
    return calls * len(x) / (time.perf_counter() - started)


def idle_cpu_s(call: Call, x: np.ndarray, calls: int, gap_s: float) -> float:
    """CPU seconds of ``calls`` calls with ``gap_s`` of sleep after each."""
    call(x)
    before = cpu_s()
    for _ in range(calls):
        call(x)
        time.sleep(gap_s)
    return cpu_s() - before


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.onnxruntime_sessions", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="per contender and size in a round")
    args = parser.parse_args()
    model = mlp_bytes()
    rng = np.random.default_rng(1)
    inputs = {rows: rng.standard_normal((rows, 64)).astype(np.float32) for rows in (64, 1024, 4096)}

    paths = call_paths(model)
    samples: dict[tuple[str, int], list[float]] = {(name, rows): [] for name in paths for rows in inputs}
    for _ in range(args.rounds):
        for rows, x in inputs.items():
            for name, call in paths.items():
                samples[name, rows].append(rows_per_s(call, x, args.seconds))
    print(f"onnxruntime {ort.__version__}: call paths, 1 intra-op thread, median of {args.rounds} rounds")
    print("| call | " + " | ".join(f"{rows:,} rows/call" for rows in inputs) + " |")
    print("|---|" + "---:|" * len(inputs))
    for name in paths:
        cells = " | ".join(f"{statistics.median(samples[name, rows]):,.0f} rows/s" for rows in inputs)
        print(f"| {name} | {cells} |")

    cores = len(os.sched_getaffinity(0))
    layouts = {
        f"{threads} intra-op thread(s), {'parallel' if parallel else 'sequential'}": session(
            model, threads=threads, spinning=False, parallel=parallel
        )
        for threads in sorted({max(1, cores - 1), cores})
        for parallel in (False, True)
    }
    whole, halves = inputs[4096], (inputs[4096][:2048], inputs[4096][2048:])
    together: dict[tuple[str, str], list[float]] = {(n, w): [] for n in layouts for w in ("one", "two")}
    with ThreadPoolExecutor(max_workers=1) as other:
        for _ in range(args.rounds):
            for name, opened in layouts.items():

                def one_call(x: np.ndarray, opened: ort.InferenceSession = opened) -> object:
                    return opened.run(None, {"features": x})

                def two_calls(x: np.ndarray, opened: ort.InferenceSession = opened) -> object:
                    second = other.submit(opened.run, None, {"features": halves[1]})
                    first = opened.run(None, {"features": halves[0]})
                    return first, second.result()

                together[name, "one"].append(rows_per_s(one_call, whole, args.seconds))
                together[name, "two"].append(rows_per_s(two_calls, whole, args.seconds))
    print(f"\nconcurrent calls, {cores} cores, 4,096 rows, median of {args.rounds} rounds")
    print("| session | one call of 4,096 rows | two concurrent calls of 2,048 |")
    print("|---|---:|---:|")
    for name in layouts:
        print(
            f"| {name} | {statistics.median(together[name, 'one']):,.0f} rows/s "
            f"| {statistics.median(together[name, 'two']):,.0f} rows/s |"
        )

    spin = {flag: session(model, threads=2, spinning=flag) for flag in (True, False)}
    idle: dict[bool, list[float]] = {True: [], False: []}
    busy: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for flag, opened in spin.items():

            def call(x: np.ndarray, opened: ort.InferenceSession = opened) -> object:
                return opened.run(None, {"features": x})

            idle[flag].append(idle_cpu_s(call, inputs[64], calls=200, gap_s=0.002))
            busy[flag].append(rows_per_s(call, inputs[1024], args.seconds))
    print(f"\nspinning, 2 intra-op threads, median of {args.rounds} rounds")
    print("| pool threads | CPU s for 200 calls of 64 rows, 2 ms apart | 1,024-row calls back to back |")
    print("|---|---:|---:|")
    for flag in (True, False):
        label = "spin (onnxruntime's default)" if flag else "no spinning (the backend's)"
        print(
            f"| {label} | {statistics.median(idle[flag]):.3f} | {statistics.median(busy[flag]):,.0f} rows/s |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

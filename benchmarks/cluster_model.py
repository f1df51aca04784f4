"""On paper, past this machine: the rows/s of a node with C executor cores and G GPUs, and of N nodes.

    python -m benchmarks.cluster_model [--nodes 10] [--gpu T4] [--quick]   # prints the section

Nothing runs here: the section is computed from what the suite measured on this machine (the CPU
per row of Spark's JVM, the Python workers and the model server, in ``spark_e2e.json``; the server's
CPU by thread and TensorFlow's cost per call, in ``transport.json``), from the example models'
layer sizes (FLOPs and bytes per row, counted) and from GPU datasheets, with every assumption
named. ``benchmarks.docs`` renders it after the measured sections, so a new run of the comparisons
moves these figures with it.

A node is as fast as the slowest of three things (each a rows/s limit):

- the executors: ``C`` cores / (JVM + Python worker CPU-s per row); with no GPU the CPU server
  shares those cores, so its CPU per row joins the sum;
- the servers' event loops: one thread per server, so one core's worth each / event-loop CPU-s
  per row; the node runs one server per GPU (one CPU server without);
- the GPUs: ``G`` x rows per backend call / time per call (TensorFlow's host cost per call, the
  kernel launches, the PCIe copies and the arithmetic or memory traffic, whichever is slower).
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.cli import QUICK_RESULTS_DIR
from benchmarks.report import RESULTS_DIR, Table, format_cell
from udfserve.services.examples.generate_models import EXAMPLES
from udfserve.spark_client.common.config import ClientConfig
from udfserve.spark_client.executor.rechunk import planned_request_rows

REPO_ROOT = Path(__file__).resolve().parent.parent
HEADING = "10. On paper: a cluster of N nodes with G GPUs"
EXECUTOR_CORES = (4, 8, 16, 32, 64)
GPUS_PER_NODE = (0, 1, 2, 4, 8)
DEFAULT_NODES = 10
DEFAULT_GPU = "T4"
FLOAT_BYTES = 4
UDFSERVE_CONTENDERS = (
    "1a remote_predict",
    "1a remote_predict, udf_type='arrow'",
    "1a predict_arrow",
    "1a predict_files",
)
CPU_TABLE_PREFIX = "CPU seconds per million rows"
THREAD_TABLE_PREFIX = "Per request over the unix socket"
STAGE_TABLE_PREFIX = "Each stage of the request path timed alone"
EVENT_LOOP_COLUMN = "server CPU: event loop (main thread)"
SERVER_THREAD_COLUMNS = (
    EVENT_LOOP_COLUMN,
    "server CPU: other Python threads (inference calls)",
    "server CPU: TensorFlow compute threads",
    "server CPU: gRPC core and other threads",
)

# Assumptions: not measured anywhere, named in the section as assumptions.
KERNEL_LAUNCH_S = 5e-6
DENSE_FLOP_UTILISATION = 0.5
LSTM_FLOP_UTILISATION = 0.1
MEMORY_UTILISATION = 0.7
PCIE_UTILISATION = 0.7

GPU_SOURCE = "NVIDIA datasheet"


@dataclass(frozen=True)
class Gpu:
    """A datasheet's figures: dense peaks (no sparsity), memory and host link per direction."""

    name: str
    fp32_tflops: float
    fp16_tensor_tflops: float
    memory_gb_s: float
    pcie_gb_s: float
    url: str


GPUS: dict[str, Gpu] = {
    gpu.name: gpu
    for gpu in (
        Gpu(
            "T4",
            8.1,
            65.0,
            320.0,
            16.0,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
        ),
        Gpu(
            "L4",
            30.3,
            121.0,
            300.0,
            32.0,
            "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet",
        ),
        Gpu(
            "A10",
            31.2,
            125.0,
            600.0,
            32.0,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf",
        ),
        Gpu(
            "A100 80GB PCIe",
            19.5,
            312.0,
            1935.0,
            32.0,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        ),
    )
}


@dataclass(frozen=True)
class Dense:
    inputs: int
    units: int
    activation: str  # "relu" or "softmax"


@dataclass(frozen=True)
class BiLstm:
    steps: int
    features: int
    units: int


Layer = Dense | BiLstm

ARCHITECTURES: dict[str, tuple[Layer, ...]] = {
    # services/examples/generate_models.py: _tabular_mlp and _sequence_bilstm
    "tabular_mlp": (Dense(64, 256, "relu"), Dense(256, 256, "relu"), Dense(256, 8, "softmax")),
    "sequence_bilstm": (BiLstm(16, 32, 32), Dense(64, 4, "softmax")),
}
KERNELS_PER_CALL = {
    # assumption: MatMul, BiasAdd and the activation per Dense layer, as TensorFlow runs them
    # without XLA; the LSTM's input GEMM plus a recurrent GEMM and a gate kernel per step and
    # direction, the concatenation, and the Dense layer's three.
    "tabular_mlp": 9,
    "sequence_bilstm": 2 * (1 + 2 * 16) + 1 + 3,
}


def activation_flops(activation: str, units: int) -> int:
    """relu: one comparison per unit; softmax: exp, the sum's additions and a division per unit."""
    return units if activation == "relu" else 3 * units - 1


def layer_flops(layer: Layer) -> int:
    """FLOPs per row: a multiply-add is 2, an elementwise op (transcendentals included) is 1."""
    if isinstance(layer, Dense):
        return 2 * layer.inputs * layer.units + layer.units + activation_flops(layer.activation, layer.units)
    gates = 4 * layer.units
    matmuls = 2 * layer.features * gates + 2 * layer.units * gates
    # x·W + h·U + b (2 additions per gate value), 3 sigmoids and a tanh, c = f*c + i*g (3),
    # h = o * tanh(c) (2)
    elementwise = 2 * gates + 4 * layer.units + 3 * layer.units + 2 * layer.units
    return 2 * layer.steps * (matmuls + elementwise)


def layer_floats_moved(layer: Layer) -> int:
    """Device-memory floats read and written per row: a Dense layer reads its input and writes its
    output once; an LSTM step reads its input, h and c, writes and reads back the 4 gates, writes h
    and c (per direction)."""
    if isinstance(layer, Dense):
        return layer.inputs + layer.units
    return 2 * layer.steps * (layer.features + 2 * layer.units + 2 * 4 * layer.units + 2 * layer.units)


def input_floats(layers: tuple[Layer, ...]) -> int:
    first = layers[0]
    return first.inputs if isinstance(first, Dense) else first.steps * first.features


def output_floats(layers: tuple[Layer, ...]) -> int:
    last = layers[-1]
    return last.units if isinstance(last, Dense) else 2 * last.units


def formula_text(layers: tuple[Layer, ...]) -> str:
    parts = []
    for layer in layers:
        if isinstance(layer, Dense):
            parts.append(
                f"Dense {layer.inputs}→{layer.units} {layer.activation}: 2·{layer.inputs}·{layer.units} + "
                f"{layer.units} + {activation_flops(layer.activation, layer.units)} = {layer_flops(layer):,}"
            )
        else:
            parts.append(
                f"BiLSTM {layer.steps}x{layer.features}→2·{layer.units}: "
                f"2 directions x {layer.steps} steps x "
                f"(2·{layer.features}·{4 * layer.units} + 2·{layer.units}·{4 * layer.units} + "
                f"17·{layer.units}) = {layer_flops(layer):,}"
            )
    return "; ".join(parts)


@dataclass(frozen=True)
class ModelCosts:
    """What one model costs per row, in seconds of CPU or device time, and where each came from."""

    model: str
    contender: str
    jvm_s: float
    workers_s: float
    server_s: float
    event_loop_s: float
    serving_s: float
    """The server's CPU per row with no arithmetic (all threads): what stays on the host with a GPU."""
    gpu_call_s: dict[str, tuple[float, float]]
    """GPU name -> (time of one call of ``batch_rows`` with one call at a time, with two)."""
    gpu_call_fp16_s: dict[str, float]
    """GPU name -> time of one call, one at a time, of the model converted to FP16."""
    batch_rows: int
    sources: tuple[str, ...]

    @property
    def executor_s(self) -> float:
        return self.jvm_s + self.workers_s


@dataclass(frozen=True)
class NodeEstimate:
    cores: int
    gpus: int
    executors_rows_s: float
    event_loops_rows_s: float
    gpus_rows_s: float | None
    server_cores_busy: float

    @property
    def rows_s(self) -> float:
        return min(self.limits().values())

    @property
    def bottleneck(self) -> str:
        limits = self.limits()
        return min(limits, key=lambda name: limits[name])

    def limits(self) -> dict[str, float]:
        limits = {"executor cores": self.executors_rows_s, "server event loop": self.event_loops_rows_s}
        if self.gpus_rows_s is not None:
            limits["GPU"] = self.gpus_rows_s
        return limits


def node_estimate(costs: ModelCosts, cores: int, gpus: int, gpu: str) -> NodeEstimate:
    """One node: with no GPU one CPU server shares the executors' cores; with G GPUs, G servers on
    cores of their own (one event loop each), each feeding one GPU one call at a time (the default
    ``--inference-threads 1``)."""
    if gpus == 0:
        executors = cores / (costs.executor_s + costs.server_s)
        event_loops = 1 / costs.event_loop_s
        rate = min(executors, event_loops)
        return NodeEstimate(cores, 0, executors, event_loops, None, rate * costs.server_s)
    executors = cores / costs.executor_s
    event_loops = gpus / costs.event_loop_s
    on_gpus = gpus * costs.batch_rows / costs.gpu_call_s[gpu][0]
    rate = min(executors, event_loops, on_gpus)
    return NodeEstimate(cores, gpus, executors, event_loops, on_gpus, rate * costs.serving_s)


CHANGES = {
    ("executor cores", True): "more executor cores (the CPU server shares them); the Arrow UDF kinds",
    (
        "executor cores",
        False,
    ): "more executor cores per GPU; `udf_type='arrow'` or `predict_arrow` (least worker CPU)",
    ("server event loop", True): (
        "a second CPU server (`udfserve node --devices sim:0,sim:1`, round-robin by partition); "
        "`rows_per_request`/`bytes_per_request` up"
    ),
    ("server event loop", False): (
        "keep `shared_memory` and the unix socket on; `rows_per_request`/`bytes_per_request` up; "
        "more GPUs (the node runs one server per GPU; a second per GPU is not a setting)"
    ),
    ("GPU", False): "`max_batch_size` up, `--inference-threads 2`; `max_in_flight` to keep the queue full",
}


def load_document(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def find_table(document: dict[str, Any], prefix: str, path: Path) -> dict[str, Any]:
    for table in document["tables"]:
        if table["title"].startswith(prefix):
            return table  # type: ignore[no-any-return]
    raise ValueError(
        f"{path} has no table whose title starts with {prefix!r}; the comparison wrote: "
        f"{[table['title'] for table in document['tables']]}"
    )


def per_request_interpolated(rows: list[dict[str, Any]], request_bytes: float, column: str) -> float:
    """A server's µs per request at ``request_bytes``: linear between the two measured request sizes
    around it (identity rows of float32[64]), the nearest two at either end."""
    points = sorted((row["rows/request"] * 64 * FLOAT_BYTES, row[column]) for row in rows)
    lower, upper = points[0], points[1]
    for left, right in itertools.pairwise(points):
        lower, upper = left, right
        if request_bytes <= right[0]:
            break
    fraction = (request_bytes - lower[0]) / (upper[0] - lower[0])
    return float(lower[1] + fraction * (upper[1] - lower[1]))


@dataclass(frozen=True)
class CallTimes:
    """The parts of one GPU backend call, in seconds."""

    host_s: float
    """TensorFlow's host cost and the kernel launches."""
    launches_s: float
    copies_s: float
    arithmetic_s: float
    memory_s: float

    @property
    def device_s(self) -> float:
        return self.copies_s + max(self.arithmetic_s, self.memory_s)


def call_times(model: str, batch_rows: int, gpu: Gpu, host_call_s: float, fp16: bool = False) -> CallTimes:
    """One backend call of ``batch_rows`` on ``gpu``. ``fp16``: a model converted to half precision
    on the Tensor Cores (its activations half the bytes; Spark's float32 still crosses PCIe)."""
    layers = ARCHITECTURES[model]
    utilisation = (
        LSTM_FLOP_UTILISATION if any(isinstance(x, BiLstm) for x in layers) else DENSE_FLOP_UTILISATION
    )
    peak_tflops = gpu.fp16_tensor_tflops if fp16 else gpu.fp32_tflops
    activation_bytes = FLOAT_BYTES // 2 if fp16 else FLOAT_BYTES
    launches_s = KERNELS_PER_CALL[model] * KERNEL_LAUNCH_S
    return CallTimes(
        host_s=host_call_s + launches_s,
        launches_s=launches_s,
        copies_s=batch_rows
        * FLOAT_BYTES
        * (input_floats(layers) + output_floats(layers))
        / (gpu.pcie_gb_s * 1e9 * PCIE_UTILISATION),
        arithmetic_s=batch_rows * sum(layer_flops(x) for x in layers) / (peak_tflops * 1e12 * utilisation),
        memory_s=batch_rows
        * activation_bytes
        * sum(layer_floats_moved(x) for x in layers)
        / (gpu.memory_gb_s * 1e9 * MEMORY_UTILISATION),
    )


def gpu_call_seconds(
    model: str, batch_rows: int, gpu: Gpu, host_call_s: float, fp16: bool = False
) -> tuple[float, float]:
    """(One call at a time: host, launches, copies and device in series; two at a time
    (``--inference-threads 2``): the host's part of one call beside the device's of the other, so
    the slower of the two.)"""
    times = call_times(model, batch_rows, gpu, host_call_s, fp16)
    return times.host_s + times.device_s, max(times.host_s, times.device_s)


def host_call_seconds(results_dir: Path) -> float:
    """TensorFlow's host cost of one call (F1): ``model.predict`` of the identity model, 1,024 rows."""
    path = results_dir / "transport.json"
    for row in find_table(load_document(path), STAGE_TABLE_PREFIX, path)["rows"]:
        if row["stage"] == "server: model.predict":
            return float(row["1,024 rows, µs"]) * 1e-6
    raise ValueError(f"{path}: the stage table has no 'server: model.predict' row")


def read_costs(results_dir: Path) -> dict[str, list[ModelCosts]]:
    """Each model's costs for each udfserve contender of the end-to-end run, from the results."""
    e2e_path = results_dir / "spark_e2e.json"
    transport_path = results_dir / "transport.json"
    e2e = load_document(e2e_path)
    transport = load_document(transport_path)
    cpu_table = find_table(e2e, CPU_TABLE_PREFIX, e2e_path)
    threads = [
        row
        for row in find_table(transport, THREAD_TABLE_PREFIX, transport_path)["rows"]
        if row["server"] == "default"
    ]
    host_call_s = host_call_seconds(results_dir)
    client = ClientConfig()
    costs: dict[str, list[ModelCosts]] = {}
    for model, layers in ARCHITECTURES.items():
        row_bytes = input_floats(layers) * FLOAT_BYTES
        batch_rows = int(EXAMPLES[model][2]["max_batch_size"])
        request_rows = planned_request_rows(
            client.rows_per_request, client.bytes_per_request, row_bytes, batch_rows
        )
        request_bytes = request_rows * row_bytes
        event_loop_s = (
            per_request_interpolated(threads, request_bytes, EVENT_LOOP_COLUMN) * 1e-6 / request_rows
        )
        serving_s = (
            sum(per_request_interpolated(threads, request_bytes, column) for column in SERVER_THREAD_COLUMNS)
            * 1e-6
            / request_rows
        )
        gpu_calls = {
            name: gpu_call_seconds(model, batch_rows, gpu, host_call_s) for name, gpu in GPUS.items()
        }
        fp16_calls = {
            name: gpu_call_seconds(model, batch_rows, gpu, host_call_s, fp16=True)[0]
            for name, gpu in GPUS.items()
        }
        for row in cpu_table["rows"]:
            if row["model"] != model or row["contender"] not in UDFSERVE_CONTENDERS:
                continue
            costs.setdefault(model, []).append(
                ModelCosts(
                    model=model,
                    contender=row["contender"],
                    jvm_s=row["JVM"] * 1e-6,
                    workers_s=row["Python workers"] * 1e-6,
                    server_s=row["model server"] * 1e-6,
                    event_loop_s=event_loop_s,
                    serving_s=serving_s,
                    gpu_call_s=gpu_calls,
                    gpu_call_fp16_s=fp16_calls,
                    batch_rows=batch_rows,
                    sources=("M1", "M2", "M3", "A1"),
                )
            )
    return costs


def best_contender(candidates: list[ModelCosts]) -> ModelCosts:
    """The udfserve path with the least executor CPU per row: what a team scaling out would pick."""
    return min(candidates, key=lambda costs: costs.executor_s)


def estimates_table(costs: ModelCosts, nodes: int, gpu: str) -> Table:
    table = Table(
        title=f"{costs.model} through {costs.contender[3:]}, {gpu} GPUs (FP32); N = {nodes} nodes",
        columns=[
            "C",
            "G",
            "executors rows/s",
            "event loops rows/s",
            "GPUs rows/s",
            "node rows/s",
            "bottleneck",
            f"{nodes} nodes rows/s",
            "server cores busy",
            "change",
            "sources",
        ],
    )
    for gpus in GPUS_PER_NODE:
        for cores in EXECUTOR_CORES:
            estimate = node_estimate(costs, cores, gpus, gpu)
            sources = ["M1", "M2", "A1", "A4"] + (["M3"] if gpus == 0 else ["G1", "F1", "A2", "A3"])
            table.rows.append(
                {
                    "C": cores,
                    "G": gpus,
                    "executors rows/s": estimate.executors_rows_s,
                    "event loops rows/s": estimate.event_loops_rows_s,
                    "GPUs rows/s": estimate.gpus_rows_s,
                    "node rows/s": estimate.rows_s,
                    "bottleneck": estimate.bottleneck,
                    f"{nodes} nodes rows/s": nodes * estimate.rows_s,
                    "server cores busy": estimate.server_cores_busy,
                    "change": CHANGES[(estimate.bottleneck, gpus == 0)],
                    "sources": ", ".join(sources),
                }
            )
    return table


def where_it_moves(costs: ModelCosts, gpu: str) -> str:
    """The executor cores at which each G stops being bound by its executors, in words."""
    parts = []
    for gpus in GPUS_PER_NODE:
        estimate = node_estimate(costs, EXECUTOR_CORES[0], gpus, gpu)
        other = {name: rate for name, rate in estimate.limits().items() if name != "executor cores"}
        name = min(other, key=lambda key: other[key])
        per_core = estimate.executors_rows_s / EXECUTOR_CORES[0]
        text = (
            f"G={gpus}: executor-bound up to {other[name] / per_core:.0f} executor cores, then the "
            f"{name} at {format_cell(other[name])} rows/s"
        )
        if estimate.gpus_rows_s is not None and name != "GPU":
            text += f" (the GPUs would allow {format_cell(estimate.gpus_rows_s)})"
        parts.append(text)
    return "; ".join(parts)


def sources_list(results_dir: Path, costs: dict[str, list[ModelCosts]]) -> list[str]:
    folder = results_dir.resolve()
    shown = folder.relative_to(REPO_ROOT) if folder.is_relative_to(REPO_ROOT) else folder
    e2e = f"`{shown.as_posix()}/spark_e2e.json`"
    transport = f"`{shown.as_posix()}/transport.json`"
    client = ClientConfig()
    lines = [
        f"- **M1** {e2e}, table *CPU seconds per million rows in the run quoted, by process*, "
        "fields `JVM` and `Python workers` of the udfserve contender (rows `1a ...`): "
        "measured on this machine, local[2].",
        f"- **M2** {transport}, table *Per request over the unix socket*, rows `server: default`, field "
        f"`{EVENT_LOOP_COLUMN}` (the event-loop core) and the sum of the four `server CPU:` fields (all the "
        "server's threads), per request, interpolated linearly in bytes between the measured request sizes, "
        "divided by the rows of the Spark client's request (`ClientConfig` defaults: "
        f"`rows_per_request` {client.rows_per_request:,}, `bytes_per_request` {client.bytes_per_request:,}; "
        "udfserve.spark_client.executor.rechunk.planned_request_rows). An identity model with its payload "
        "inside the gRPC messages: the server's cost without arithmetic, an upper bound for the "
        "shared-memory path the Spark client takes.",
        f"- **M3** {e2e}, same table, field `model server`: the CPU server's whole CPU per row, arithmetic "
        "included (no GPU).",
        f"- **F1** {transport}, table *Each stage of the request path timed alone*, stage `server: "
        "model.predict`, field `1,024 rows, µs`: TensorFlow's host cost of one call of a model that does no "
        "arithmetic, taken as the host cost of one GPU call (**assumption**: the same dispatch on a GPU).",
        "- **A1** formula: FLOPs per row from the layer sizes of `services/examples/generate_models.py` "
        "(a multiply-add 2 FLOPs, an elementwise op or transcendental 1): "
        + " | ".join(f"`{model}`: {formula_text(layers)}" for model, layers in ARCHITECTURES.items())
        + ". Rows per GPU call: the example configs' `max_batch_size` "
        + ", ".join(f"{model} {int(EXAMPLES[model][2]['max_batch_size']):,}" for model in ARCHITECTURES)
        + ".",
        f"- **A2** **assumption**: the GPU reaches {DENSE_FLOP_UTILISATION:.0%} of its FP32 peak on "
        f"the Dense layers' GEMMs and {LSTM_FLOP_UTILISATION:.0%} on the LSTM "
        "(16 dependent steps of small GEMMs), "
        f"{MEMORY_UTILISATION:.0%} of its memory bandwidth and {PCIE_UTILISATION:.0%} of its PCIe link; "
        "a call takes the slower of arithmetic and memory traffic (per row: "
        + ", ".join(
            f"{model} {FLOAT_BYTES * sum(layer_floats_moved(x) for x in layers):,} B"
            for model, layers in ARCHITECTURES.items()
        )
        + "), plus the copies of its inputs and outputs over PCIe. *FP16 model*: the same with the FP16 "
        "Tensor Core peak and half the activation bytes, for the model converted to half precision "
        "(**assumption**: udfserve serves the model file as it is; the examples are FP32).",
        f"- **A3** **assumption**: {KERNEL_LAUNCH_S * 1e6:.0f} µs of host time per kernel launch (NVIDIA: "
        "*Getting Started with CUDA Graphs*, https://developer.nvidia.com/blog/cuda-graphs/, measures launch "
        "overheads of a few µs per kernel), "
        + ", ".join(f"{model} {KERNELS_PER_CALL[model]} kernels per call" for model in ARCHITECTURES)
        + " (MatMul, BiasAdd, activation per Dense layer; per LSTM step and direction a GEMM and a gate "
        "kernel). A small MLP is bound by these per-call costs, not by its FLOPs: see the GPU table.",
        "- **A4** **assumption**: the CPU per row measured on 2 cores holds on bigger nodes (no shuffle, the "
        "same parquet reading; reading from remote storage would add CPU not counted here); with G GPUs the "
        "servers run on cores beyond the executors' C (*server cores busy* says how many they use); the "
        "cluster is N independent nodes (storage bandwidth and the driver are not modelled).",
        f"- **G1** {GPU_SOURCE}s (FP32 and FP16 Tensor Core peaks without sparsity, memory bandwidth, host "
        "link per direction): " + "; ".join(f"{gpu.name} {gpu.url}" for gpu in GPUS.values()) + ".",
    ]
    return lines


def inputs_table(costs: dict[str, list[ModelCosts]]) -> Table:
    table = Table(
        title="Inputs per row: measured CPU (µs) and the counted work",
        columns=[
            "model",
            "contender",
            "JVM µs",
            "Python workers µs",
            "CPU server µs",
            "server event loop µs",
            "server, no arithmetic µs",
            "FLOPs/row",
            "sources",
        ],
    )
    for model, candidates in costs.items():
        flops = sum(layer_flops(layer) for layer in ARCHITECTURES[model])
        for item in candidates:
            table.rows.append(
                {
                    "model": model,
                    "contender": item.contender,
                    "JVM µs": item.jvm_s * 1e6,
                    "Python workers µs": item.workers_s * 1e6,
                    "CPU server µs": item.server_s * 1e6,
                    "server event loop µs": item.event_loop_s * 1e6,
                    "server, no arithmetic µs": item.serving_s * 1e6,
                    "FLOPs/row": flops,
                    "sources": "M1, M3, M2, A1",
                }
            )
    return table


def call_breakdown(model: str, batch_rows: int, gpu: Gpu, host_call_s: float) -> str:
    """Where one call's time goes on ``gpu``: the per-call costs beside the arithmetic."""
    times = call_times(model, batch_rows, gpu, host_call_s)
    return (
        f"`{model}` on a {gpu.name}, {batch_rows:,} rows per call: TensorFlow's host cost "
        f"{host_call_s * 1e6:.0f} µs (F1) + launches {times.launches_s * 1e6:.0f} µs (A3) + PCIe copies "
        f"{times.copies_s * 1e6:.0f} µs against {times.arithmetic_s * 1e6:.0f} µs of arithmetic (A1, A2)"
    )


def gpu_table(costs: dict[str, list[ModelCosts]]) -> Table:
    table = Table(
        title="One GPU, one server: rows/s of the backend calls (FP32), one call at a time and two",
        columns=[
            "GPU",
            "FP32 TFLOPS",
            "FP16 tensor TFLOPS",
            "memory GB/s",
            "PCIe GB/s",
            *(
                f"{model}: {label}"
                for model in costs
                for label in ("µs/call", "rows/s", "rows/s, 2 calls", "rows/s, FP16 model")
            ),
            "sources",
        ],
    )
    for name, gpu in GPUS.items():
        row: dict[str, Any] = {
            "GPU": name,
            "FP32 TFLOPS": gpu.fp32_tflops,
            "FP16 tensor TFLOPS": gpu.fp16_tensor_tflops,
            "memory GB/s": gpu.memory_gb_s,
            "PCIe GB/s": gpu.pcie_gb_s,
            "sources": "G1, A1, A2, A3, F1",
        }
        for model, candidates in costs.items():
            serial_s, overlapped_s = candidates[0].gpu_call_s[name]
            batch = candidates[0].batch_rows
            row[f"{model}: µs/call"] = serial_s * 1e6
            row[f"{model}: rows/s"] = batch / serial_s
            row[f"{model}: rows/s, 2 calls"] = batch / overlapped_s
            row[f"{model}: rows/s, FP16 model"] = batch / candidates[0].gpu_call_fp16_s[name]
        table.rows.append(row)
    return table


def section(results_dir: Path = RESULTS_DIR, nodes: int = DEFAULT_NODES, gpu: str = DEFAULT_GPU) -> list[str]:
    """The section of docs/benchmarks.md, as lines, from the results in ``results_dir``."""
    parts = [f"## {HEADING}", ""]
    missing = [name for name in ("spark_e2e.json", "transport.json") if not (results_dir / name).exists()]
    if missing:
        needed = " and ".join(f"`python -m benchmarks.{name.removesuffix('.json')}`" for name in missing)
        return [*parts, f"Not computed yet: it needs {', '.join(missing)} ({needed}).", ""]
    costs = read_costs(results_dir)
    parts += [
        "Computed, not measured: `python -m benchmarks.cluster_model` (no runs) from this machine's measured "
        "CPU per row, the example models' counted FLOPs and GPU datasheets. A node with C executor cores "
        "and G GPUs serves the least of: its executors, C / (JVM + Python worker CPU-s per row); its "
        "servers' event loops, one core each (one server per GPU, `udfserve node --devices auto`; "
        "one CPU server without a "
        "GPU) / event-loop CPU-s per row; its GPUs, G x rows per call / time per call. Without a GPU the CPU "
        "server's CPU per row joins the executors' on the same C cores. N nodes serve N times one node. "
        "Every figure names its source (list below); assumptions are marked as such.",
        "",
        inputs_table(costs).to_markdown(),
        "",
        gpu_table(costs).to_markdown(),
        "",
        "Per call: "
        + "; ".join(
            call_breakdown(model, candidates[0].batch_rows, GPUS[gpu], host_call_seconds(results_dir))
            for model, candidates in costs.items()
        )
        + ". With `--inference-threads 2` the host's part of one call runs beside the device's part of "
        "another (*2 calls*).",
        "",
    ]
    for model, candidates in costs.items():
        chosen = best_contender(candidates)
        parts += [
            estimates_table(chosen, nodes, gpu).to_markdown(),
            "",
            f"*Where the bottleneck moves ({model}, {gpu})*: {where_it_moves(chosen, gpu)}.",
            "",
        ]
    parts += ["### Sources and assumptions", "", *sources_list(results_dir, costs), ""]
    return parts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="N, the nodes of the cluster")
    parser.add_argument("--gpu", choices=list(GPUS), default=DEFAULT_GPU, help="the GPU of the node table")
    parser.add_argument("--quick", action="store_true", help="from the quick run's results")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error(f"--nodes must be at least 1, got {args.nodes}")
    results_dir = QUICK_RESULTS_DIR if args.quick else RESULTS_DIR
    print("\n".join(section(results_dir, args.nodes, args.gpu)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

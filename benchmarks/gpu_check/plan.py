"""The sizes of one run of the GPU check: the real run on a GPU, or the CPU dry run.

The GPU run is sized to finish in well under 8 minutes on one H100 or H200 with 16 cores; the
dry run keeps every check but with rows and models small enough for a test on 2 shared cores.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Device = Literal["gpu", "cpu"]


@dataclass(frozen=True)
class Plan:
    """What one run does, and how big."""

    device: Device
    rows: int
    """Rows the executors score through the node, for the MLP and for the null model."""
    heavy_rows: int
    """Rows of the compute-heavy model through the server and in-process on the GPU."""
    heavy_cpu_budget_s: float
    """The in-process CPU run of the heavy model stops after this long (it is the slow one)."""
    executors: int
    """Executor processes scoring side by side, as Spark runs several tasks on a node."""
    heavy_side: int
    """The heavy conv net's images are ``heavy_side`` x ``heavy_side``, one channel."""
    heavy_channels: tuple[int, int, int]
    heavy_max_batch_size: int
    """The heavy model's ``max_batch_size``; its warm-up runs that many rows when it loads."""
    oom_width: int
    """The out-of-memory model's hidden width: each row holds two float32 vectors of it at once."""
    oom_request_rows: int
    """Rows of the one request that does not fit the cap."""
    oom_cap_bytes: int
    """Memory the out-of-memory server may take beyond what it holds once loaded."""
    spark_batch_rows: int = 10_000
    """Rows of each Arrow batch an executor hands the client (Spark's maxRecordsPerBatch default)."""
    max_in_flight: int = 4
    seed: int = 42
    mlp_features: int = 64
    null_outputs: int = 8

    @property
    def server_device(self) -> str:
        """The ``--device`` of ``udfserve serve``."""
        return "gpu:0" if self.device == "gpu" else "cpu"

    @property
    def heavy_features(self) -> int:
        return self.heavy_side * self.heavy_side

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


GPU_PLAN = Plan(
    device="gpu",
    rows=1_000_000,
    heavy_rows=400_000,
    heavy_cpu_budget_s=20.0,
    executors=4,
    heavy_side=32,
    heavy_channels=(32, 64, 128),
    heavy_max_batch_size=4096,
    oom_width=16_384,
    oom_request_rows=65_536,
    oom_cap_bytes=1 << 30,
)

CPU_PLAN = Plan(
    device="cpu",
    rows=20_000,
    heavy_rows=2_000,
    heavy_cpu_budget_s=5.0,
    executors=2,
    heavy_side=16,
    heavy_channels=(8, 16, 16),
    heavy_max_batch_size=512,
    oom_width=4_096,
    oom_request_rows=32_768,
    oom_cap_bytes=256 << 20,
)


def plan_for(device: Device, rows: int | None = None, heavy_rows: int | None = None) -> Plan:
    """The plan of ``device``, with the row counts given instead of its own."""
    plan = GPU_PLAN if device == "gpu" else CPU_PLAN
    changes: dict[str, Any] = {}
    if rows is not None:
        changes["rows"] = rows
    if heavy_rows is not None:
        changes["heavy_rows"] = heavy_rows
    return dataclasses.replace(plan, **changes)

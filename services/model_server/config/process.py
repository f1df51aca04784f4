"""Settings of how the process runs model calls (the bound on one call, threads per model, calls
cut per core) and how it runs and stops (its event loop, the lifeline, the exit deadline)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from udfserve.services.model_server.core.cpu_parallel import ROW_ALIGNMENT
from udfserve.services.model_server.event_loop import EventLoopChoice


class CallSettings(BaseModel):
    """How backend calls run, and how long the process may take to exit after SIGTERM."""

    exit_timeout_s: float = Field(
        default=5.0,
        ge=0.0,
        le=600.0,
        description="after SIGTERM the process exits within --grace-period-s plus this, whatever its "
        "threads are doing (a model call that cannot be stopped included), as Triton's "
        "--exit-timeout-secs",
    )
    model_call_timeout_s: float = Field(
        default=120.0,
        ge=0.0,
        le=86400.0,
        description="bound on one backend call: a call past it is stopped where the backend can stop one "
        "(ONNX Runtime) and its batch fails DEADLINE_EXCEEDED; one that cannot be stopped (TensorFlow, "
        "PyTorch) fails what the model holds UNAVAILABLE and the server exits for a fresh process; "
        "0: no bound",
    )
    inference_threads: int = Field(default=1, ge=1, le=64, description="concurrent backend calls per model")
    cpu_parallel_min_rows: int = Field(
        default=0,
        ge=0,
        description="on a CPU device (cpu, sim:N), a backend call of at least twice this many rows runs as "
        "one call per core on contiguous parts, concurrently (256 is a good start): lower latency for "
        "large requests on idle cores, more CPU per row; 0 (default) never cuts calls",
    )

    @field_validator("cpu_parallel_min_rows")
    @classmethod
    def _cpu_parallel_min_rows(cls, value: int) -> int:
        if 0 < value < ROW_ALIGNMENT:
            raise ValueError(
                f"cpu_parallel_min_rows must be 0 (off) or at least {ROW_ALIGNMENT} rows, received {value}"
            )
        return value


class ProcessSettings(BaseModel):
    """The event loop, and the pipe whose end tells the server that its starter is gone."""

    event_loop: EventLoopChoice = Field(
        default="auto",
        description="event loop of the server: uvloop (less CPU per request), asyncio (the standard "
        "loop), or auto: uvloop when installed",
    )
    lifeline_fd: int | None = Field(
        default=None,
        ge=0,
        description="inherited read end of a pipe whose write end the starting process holds: at its "
        "end of file (that process died, even by SIGKILL) the server drains and exits as on SIGTERM; "
        "`udfserve node` passes it to every server",
    )

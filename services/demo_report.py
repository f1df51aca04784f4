"""The demo's report: what the job did, where its time went, and what its answers are.

Every line compares like with like. The client's batches are set against the sends they took (a
batch refused RESOURCE_EXHAUSTED, or whose shared memory a server refused, is sent again); the
sends whose payload went through the node's shared memory against all sends, with the servers'
own count of the payloads they read there beside it; the client's waits before resends against
its tasks' time. The servers' figures (rows, shared-memory reads, time in model calls, requests
held until the model's queue had room) are what their ``/metrics`` counted over the job.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from udfserve.discovery import NodeDiscovery
from udfserve.services.demo_node import SHARED_MEMORY_REQUESTS, metrics_addresses, sample_total

if TYPE_CHECKING:
    from udfserve.spark_client.observability.stats import ClientStats

_SERIES = {
    "rows": ("udfserve_rows_total", True),
    "shared_memory_reads": (SHARED_MEMORY_REQUESTS, False),
    "model_call_s": ("udfserve_inference_duration_seconds_sum", True),
    "room_waits": ("udfserve_queue_room_wait_seconds_count", True),
    "room_wait_s": ("udfserve_queue_room_wait_seconds_sum", True),
}
"""Each figure of ``ServerFigures``: its series, and whether it is the model's (else the server's)."""


@dataclass(frozen=True)
class ServerFigures:
    """What the node's servers counted, summed over them: rows answered for the model, payloads
    read from shared memory (any model), seconds in the model's calls, and requests held until
    the model's queue had room, with their seconds (a server that does not hold them counts 0)."""

    rows: float = 0.0
    shared_memory_reads: float = 0.0
    model_call_s: float = 0.0
    room_waits: float = 0.0
    room_wait_s: float = 0.0

    @classmethod
    def scrape(cls, discovery: NodeDiscovery, model: str) -> ServerFigures:
        """The figures now, from one read of each server's ``/metrics``."""
        totals = dict.fromkeys(_SERIES, 0.0)
        for address in metrics_addresses(discovery):
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                text = response.read().decode()
            for key, (series, per_model) in _SERIES.items():
                totals[key] += sample_total(text, series, model if per_model else None)
        return cls(**totals)

    def since(self, earlier: ServerFigures) -> ServerFigures:
        """What was counted between ``earlier`` and these figures."""
        return ServerFigures(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
        )


@dataclass(frozen=True)
class WarmUp:
    """The untimed job the demo runs first, through a UDF object of its own."""

    rows: int
    tasks: int
    seconds: float


def warm_up_line(warm_up: WarmUp | None) -> str:
    """The report's line on the warm-up job, which the throughput above leaves out."""
    if warm_up is None:
        return (
            "warm-up                none (--warm-up-rows 0): the time above includes starting Spark's "
            "Python workers, their imports and connections"
        )
    return (
        f"warm-up                {warm_up.rows:,} rows in {warm_up.tasks:,} tasks, {warm_up.seconds:.1f} s, "
        "before the timed job and not counted in it: started Spark's Python workers, their imports "
        "and connections, once per application"
    )


def traffic_lines(client: ClientStats, servers: ServerFigures, job_s: float) -> list[str]:
    """The report's lines on how the batches travelled: sends and resends, payloads, waits, and
    the servers' time in model calls."""
    inline = client.sends - client.sends_in_shared_memory
    task_share = client.backoff_s / client.task_s if client.task_s else 0.0
    call_share = servers.model_call_s / job_s if job_s else 0.0
    return [
        f"resends                {client.retries:,} (RESOURCE_EXHAUSTED, or shared memory refused): "
        f"{client.batches_by_server:,} batches took {client.sends:,} sends; {client.backoff_s:.2f} s waited "
        f"before resends, {task_share:.0%} of the {client.tasks:,} tasks' {client.task_s:.1f} s",
        f"payloads               {client.sends_in_shared_memory:,} of {client.sends:,} sends through the "
        f"node's shared memory (the servers read {int(servers.shared_memory_reads):,} there), "
        f"{inline:,} inline",
        f"queue room waits       {int(servers.room_waits):,} requests held by the servers until the "
        f"model's queue had room, {servers.room_wait_s:.2f} s in all",
        f"model calls            {servers.model_call_s:.1f} s in the servers' calls of the model, "
        f"{call_share:.0%} of the job's {job_s:.1f} s",
    ]


UNTRAINED_NOTE = (
    "note                   {model} is one of udfserve's example models, generated untrained (seeded "
    "random weights): its answers show that the serving path works, not a prediction{detail}"
)
_UNTRAINED_DETAIL = {
    "text_classifier": "; its three probabilities sit near 1/3 for any text",
}


def untrained_note(model: str, examples: list[str]) -> list[str]:
    """A line saying that the example model's answers mean nothing, so that nobody takes its
    near-uniform outputs for a bug; none for a model that is not an example's name."""
    if model not in examples:
        return []
    return [UNTRAINED_NOTE.format(model=model, detail=_UNTRAINED_DETAIL.get(model, ""))]

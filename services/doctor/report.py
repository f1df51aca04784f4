"""The doctor's report: one finding per check, each with its status and, for a problem, its fix.

A finding's status says what it means for jobs: ``fail`` blocks them (the command exits 1),
``warn`` makes them slower or leaves them without a safety net (rows over TCP instead of the
unix socket, no shared memory, no CPU fallback for a model), ``info`` describes this host and
asks nothing, ``ok`` is a check that passed. The same model is printed as text and as JSON, so a
script reads exactly what a person reads.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

import udfserve
from udfserve.node_files import describe_uid

Status = Literal["ok", "info", "warn", "fail"]
Group = Literal[
    "discovery", "servers", "sockets", "token", "shared_memory", "gpus", "backends", "spark_workers"
]

GROUP_TITLES: dict[str, str] = {
    "discovery": "Discovery file and supervisor",
    "servers": "Servers",
    "sockets": "Unix sockets",
    "token": "Token",
    "shared_memory": "Shared memory",
    "gpus": "GPUs",
    "backends": "Backends",
    "spark_workers": "Spark's Python workers",
}
"""The groups in the order they are printed: the node, what reaches it, then this host."""

EXIT_HEALTHY = 0
EXIT_BLOCKED = 1


class Finding(BaseModel):
    """What one check found."""

    model_config = ConfigDict(frozen=True)

    group: Group
    name: str = Field(description="what was checked: 'discovery file', a server's device, a backend")
    status: Status
    summary: str = Field(description="what was found, in plain words")
    fix: str = Field(default="", description="what to do about it; empty when nothing is to be done")
    facts: dict[str, Any] = Field(default_factory=dict, description="the figures behind it, for scripts")


class Report(BaseModel):
    """Every finding of one run, and who ran it where."""

    model_config = ConfigDict(frozen=True)

    udfserve_version: str = udfserve.__version__
    host: str = Field(default_factory=platform.node)
    user: str = Field(default_factory=lambda: describe_uid(os.geteuid()))
    python: str = sys.executable
    checked_at: float = Field(default_factory=time.time)
    findings: list[Finding]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def healthy(self) -> bool:
        """No finding blocks jobs."""
        return not self.blocking()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> dict[str, int]:
        found = {status: 0 for status in ("ok", "info", "warn", "fail")}
        for finding in self.findings:
            found[finding.status] += 1
        return found

    def blocking(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.status == "fail"]

    def in_group(self, group: str) -> list[Finding]:
        return [finding for finding in self.findings if finding.group == group]

    @property
    def exit_code(self) -> int:
        return EXIT_HEALTHY if self.healthy else EXIT_BLOCKED

"""How many threads a booster's call takes, from one typed setting read once per process.

One model server runs per device and shares the node's cores with Spark's executors, so a call
takes one core short of the process's (as ONNX Runtime's sessions and TensorFlow's pool do):
on 2 cores a call runs in one thread, and the server's ``cpu_parallel`` cuts large calls into
concurrent calls, which ``inplace_predict`` runs at once (it takes no lock).
"""

from __future__ import annotations

import os

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


class XGBoostSettings(BaseSettings):
    """Settings of XGBoost boosters, from ``UDFSERVE_XGBOOST_<FIELD>`` variables; read once when the
    backend is first used in a process (a server, or a Spark worker's CPU fallback)."""

    model_config = SettingsConfigDict(env_prefix="UDFSERVE_XGBOOST_", extra="ignore", frozen=True)

    threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="threads of one call on the CPU (XGBoost's nthread); 0: one short of the process's cores",
    )


def read_settings() -> XGBoostSettings:
    """The settings from the environment; ``ValueError`` naming each variable that is invalid, its
    value and what was expected."""
    try:
        return XGBoostSettings()
    except ValidationError as exc:
        prefix = XGBoostSettings.model_config.get("env_prefix", "")
        problems = "; ".join(
            f"{prefix}{'_'.join(str(part) for part in error['loc']).upper()}={error.get('input')!r}: "
            f"{error['msg']}"
            for error in exc.errors()
        )
        raise ValueError(f"invalid xgboost setting(s): {problems}") from None


def call_threads(settings: XGBoostSettings) -> int:
    """The setting, or one core short of the cores this process may run on (at least one)."""
    if settings.threads:
        return settings.threads
    return max(1, len(os.sched_getaffinity(0)) - 1)

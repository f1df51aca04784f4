"""The settings a model server and the node supervisor both have, declared once: the model
lifecycle, the drain, the logs, and tracing (``observability.tracing.TracingSettings``).

``udfserve node`` passes its value of each to every server it starts (``node.server_flags``), so
the node's settings class and the server's both derive from this one: the two cannot drift apart
in name, type, bounds or default, and the list of what the node passes on is read from here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from udfserve.services.log_format import LogFormat
from udfserve.services.model_server.observability.tracing import TracingSettings


class _LifecycleAndLogSettings(BaseSettings):
    """Model lifecycle, drain and logging."""

    model_config = SettingsConfigDict(env_prefix="UDFSERVE_", extra="forbid", frozen=True)

    model_control: Literal["none", "poll", "explicit"] = Field(
        default="none",
        description="how the models change while a server runs: none (loaded once at start), poll "
        "(the repository is watched: new models, version folders and config.yaml changes load, "
        "removed ones unload, once they stayed unchanged for --repository-settle-s; a version "
        "published there reaches every device of a node), explicit (load, unload and reload calls "
        "over gRPC, the token required when one is set)",
    )
    repository_poll_s: float = Field(
        default=5.0, ge=0.1, le=3600.0, description="how often --model-control poll scans the repository"
    )
    repository_settle_s: float = Field(
        default=3.0,
        ge=0.0,
        le=3600.0,
        description="how long a change in the repository must stay unchanged (no file of it growing or "
        "replaced) before --model-control poll loads it: a version still being copied is never loaded",
    )
    version_swap: Literal["beside", "unload-first"] = Field(
        default="beside",
        description="how a new version replaces an old one: beside (the new one loads and warms up "
        "while the old serves, then the old drains: both in memory for a while) or unload-first (the "
        "old drains and unloads first, for a device that cannot hold both: requests naming no version "
        "are refused RESOURCE_EXHAUSTED meanwhile, which clients ride out with back-off)",
    )
    version_drain_s: float = Field(
        default=60.0,
        ge=0.0,
        le=3600.0,
        description="how long a version being replaced or unloaded may take to answer its queued and "
        "running requests before what is left is refused UNAVAILABLE",
    )
    grace_period_s: float = Field(
        default=10.0,
        ge=0.0,
        description="time a server has to finish its in-flight work on SIGTERM (a node SIGKILLs a "
        "server still running 5 s after it)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO",
        description="log level of the server (of the supervisor and every server, for a node): DEBUG, "
        "INFO, WARNING or ERROR",
    )
    log_format: LogFormat = Field(
        default="text",
        description="how the log is written on stderr: text (lines for people) or json (one JSON object "
        "a line: time, level, logger, message, and the request, model, Spark application and trace ids "
        "where known)",
    )


class SharedServerSettings(TracingSettings, _LifecycleAndLogSettings):
    """Model lifecycle, drain, logging and tracing: one value for a node and all its servers
    (pydantic lists the fields of the last base first: tracing follows the logs in ``--help``)."""

    model_config = SettingsConfigDict(env_prefix="UDFSERVE_", extra="forbid", frozen=True)


SHARED_SETTINGS = tuple(SharedServerSettings.model_fields)
"""Settings the node and its servers both have: the node passes its value to every server."""

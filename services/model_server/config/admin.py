"""Settings of the HTTP admin app and what it reports: metrics labels, its documents, its request
rates, the pace of /metrics, and which requests are logged as slow."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

MAX_TRACKED_APPS = 512
"""Most Spark applications a server keeps as metric labels: each adds about 6 KB and 0.23 ms of
rendering to every /metrics page (measured on 2 cores), so 512 render in about 0.1 s."""


class AdminSettings(BaseModel):
    """The admin app's limits and the observability it serves."""

    max_tracked_apps: int = Field(
        default=64,
        ge=1,
        description="Spark applications kept in metrics labels (least recent out); at most "
        f"{MAX_TRACKED_APPS}, whose /metrics page renders in about 0.1 s",
    )
    http_docs: bool = Field(
        default=False,
        description="serve the admin app's OpenAPI document and pages (/openapi.json, /docs, /redoc); "
        "the document needs the token when one is set",
    )
    admin_requests_per_s: float = Field(
        default=10.0,
        gt=0,
        description="HTTP admin requests a second per client address (bursts of twice that); a client "
        "over it is answered 429 with Retry-After",
    )
    admin_total_requests_per_s: float = Field(
        default=50.0,
        gt=0,
        description="HTTP admin requests a second from all clients together; beyond, requests wait "
        "their turn, so a flood cannot take the CPU the predictions need",
    )
    metrics_min_interval_s: float = Field(
        default=0.0,
        ge=0,
        description="least time between two renders of /metrics; scrapes in between wait for the next "
        "render and share it (renders are also paced to at most 2 percent of a core)",
    )
    slow_request_s: float = Field(
        default=1.0, gt=0, description="log requests slower than this with their Spark stage and partition"
    )

    @field_validator("max_tracked_apps")
    @classmethod
    def _max_tracked_apps(cls, value: int) -> int:
        if value > MAX_TRACKED_APPS:
            raise ValueError(
                f"expected at most {MAX_TRACKED_APPS} tracked Spark applications, received {value}: each "
                "one adds about 6 KB and 0.23 ms of rendering to every /metrics page, which shares the "
                "CPU with the predictions"
            )
        return value

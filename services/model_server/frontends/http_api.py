"""The HTTP admin app: liveness, readiness, model listing and metadata, Prometheus metrics.

It runs on uvicorn in the same process and event loop as the gRPC server, so what it reports
is the state of the very process that serves predictions.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

import udfserve
from services.model_server.core.model_table import ModelInfo, ModelTable
from services.model_server.errors import ModelNotFound
from services.model_server.observability.metrics import ServerMetrics
from services.model_server.security import http_token_dependency
from udfserve.runtime.errors import InvalidInput


class Liveness(BaseModel):
    status: str
    version: str
    device: str


class Readiness(BaseModel):
    ready: bool
    reason: str
    models: dict[str, str]
    failed: dict[str, str]


def create_admin_app(
    models: ModelTable, metrics: ServerMetrics, device: str, auth_token: str | None = None
) -> FastAPI:
    """Health and /metrics are open to probes and scrapers; model endpoints need the token if set."""
    guarded = [Depends(http_token_dependency(auth_token))]
    app = FastAPI(
        title="udfserve model server",
        version=udfserve.__version__,
        description="Admin surface of one udfserve model server process.",
    )

    @app.get("/health/live", response_model=Liveness)
    async def live() -> Liveness:
        """The process answers; restart it if this fails."""
        return Liveness(status="alive", version=udfserve.__version__, device=device)

    @app.get("/health/ready", response_model=Readiness, responses={503: {"model": Readiness}})
    async def ready(response: Response) -> Readiness:
        """Ready once loading has finished, at least one model serves and the server is not draining
        (nor stopping after an unrecoverable fault).

        A model that failed to load does not make the server unready (the others serve); it is
        listed under ``failed`` with its error. A server with no model to serve says why in
        ``reason``: what its repository holds and the layout expected, or each model's error.
        """
        states: dict[str, str] = {m.name: m.state for m in models.all()}
        failed = {m.name: m.error for m in models.all() if m.state == "failed"}
        if models.fault:
            reason = f"unrecoverable fault, the server exits to be restarted: {models.fault}"
        elif models.draining:
            reason = "draining"
        elif not models.loading_done.is_set():
            reason = "loading models"
        else:
            reason = models.not_serving_reason()
        if reason:
            response.status_code = 503
        return Readiness(ready=not reason, reason=reason or "ok", models=states, failed=failed)

    @app.get("/v1/models", response_model=list[ModelInfo], dependencies=guarded)
    async def list_models() -> list[ModelInfo]:
        return [models.info(m) for m in models.all()]

    @app.get(
        "/v1/models/{name}",
        response_model=ModelInfo,
        responses={400: {"description": "invalid model name"}, 404: {"description": "unknown model"}},
        dependencies=guarded,
    )
    async def model_metadata(name: str) -> ModelInfo:
        try:
            return models.info(models.get(name))
        except InvalidInput as exc:
            raise HTTPException(status_code=400, detail=exc.message) from None
        except ModelNotFound as exc:
            raise HTTPException(status_code=404, detail=exc.message) from None

    @app.get("/v1/spark/applications", dependencies=guarded)
    async def spark_applications() -> dict[str, object]:
        """The Spark applications seen recently, with their totals (at most max_tracked_apps)."""
        tracked = metrics.applications
        return {
            "max_tracked_apps": tracked.max_tracked_apps,
            "evicted": tracked.evicted,
            "applications": tracked.listing(),
        }

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(content=metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app

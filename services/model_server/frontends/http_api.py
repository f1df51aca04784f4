"""The HTTP admin app: liveness, readiness, model listing and metadata, Prometheus metrics.

It runs on a thread and event loop of its own (``admin_server``), so a scrape or a probe flood
never takes turns of the serving loop; what it reports of the models and the Spark applications
it reads on the serving loop (``ServingLoop.call``), so it is the state of the very process that
serves predictions. Every request passes ``admin_limits`` first (a pace for the app, a rate per
client answered 429).

With a token, everything but the health endpoints needs it, ``/metrics`` included: its labels
carry the Spark application ids and names that ``/v1/spark/applications`` lists, and both are
what the jobs of the node's users are called. The OpenAPI document and its pages are served
only when asked for (``--http-docs``), behind the token too.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI, HTTPException, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import gzip_accepted
from pydantic import BaseModel
from starlette.requests import Request

import udfserve
from udfserve.runtime.errors import InvalidInput
from udfserve.services.model_server.core.model_table import ModelInfo, ModelTable
from udfserve.services.model_server.core.server_paths import without_server_paths
from udfserve.services.model_server.errors import ModelNotFound
from udfserve.services.model_server.frontends.admin_limits import AdminRateLimit
from udfserve.services.model_server.frontends.admin_server import ServingLoop, ServingLoopUnresponsive
from udfserve.services.model_server.frontends.metrics_page import MetricsPage
from udfserve.services.model_server.observability.metrics import ServerMetrics
from udfserve.services.model_server.security import http_token_dependency

VARY = {"Vary": "Accept-Encoding"}
"""A cache between scraper and server keeps the plain and the compressed page apart."""
GZIPPED = {"Content-Encoding": "gzip", **VARY}


class Liveness(BaseModel):
    status: str
    version: str
    device: str


class Readiness(BaseModel):
    ready: bool
    reason: str
    models: dict[str, str]
    """Each model's state: ready, loading, failed or unloaded."""
    failed: dict[str, str]
    """Why a model, or a version of it, does not serve (a model may serve an older version)."""
    versions: dict[str, list[int]] = {}
    """Each model's versions serving."""


class AdminLimits(BaseModel):
    """What the admin app may cost the serving loop (see ``admin_limits`` and ``metrics_page``)."""

    requests_per_client_per_s: float = 10.0
    total_requests_per_s: float = 50.0
    metrics_min_interval_s: float = 0.0


def create_admin_app(
    models: ModelTable,
    metrics: ServerMetrics,
    device: str,
    serving: ServingLoop,
    auth_token: str | None = None,
    limits: AdminLimits | None = None,
    docs: bool = False,
) -> AdminRateLimit:
    """The admin app, behind its limits. Health stays open to probes; the rest needs the token if
    set. ``docs``: serve /docs, /redoc and /openapi.json (behind the token)."""
    limits = limits or AdminLimits()
    app = admin_routes(models, metrics, device, serving, auth_token, limits, docs)
    return AdminRateLimit(
        app,
        limits.requests_per_client_per_s,
        limits.total_requests_per_s,
        on_refused=metrics.admin_refusals.inc,
    )


def admin_routes(
    models: ModelTable,
    metrics: ServerMetrics,
    device: str,
    serving: ServingLoop,
    auth_token: str | None = None,
    limits: AdminLimits | None = None,
    docs: bool = False,
) -> FastAPI:
    """The FastAPI app of the admin routes, without the limits in front of it."""
    guarded = [Depends(http_token_dependency(auth_token))]

    def render() -> bytes:
        metrics.metrics_renders.inc()
        return metrics.exposition()

    page = MetricsPage(render, (limits or AdminLimits()).metrics_min_interval_s)
    app = FastAPI(
        title="udfserve model server",
        version=udfserve.__version__,
        description="Admin surface of one udfserve model server process.",
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    if docs:  # the document itself: FastAPI's own route would be open
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/openapi.json"]

        @app.get("/openapi.json", include_in_schema=False, dependencies=guarded)
        async def openapi() -> JSONResponse:
            return JSONResponse(app.openapi())

    @app.exception_handler(ServingLoopUnresponsive)
    async def unresponsive(_request: Request, exc: ServingLoopUnresponsive) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)})

    @app.get("/health/live", response_model=Liveness, responses={503: {"description": "serving loop stuck"}})
    async def live() -> Liveness:
        """The process answers: its serving loop runs; restart it if this fails."""
        await serving.call(lambda: None)
        return Liveness(status="alive", version=udfserve.__version__, device=device)

    @app.get("/health/ready", response_model=Readiness, responses={503: {"model": Readiness}})
    async def ready(response: Response) -> Readiness:
        """Ready once loading has finished, at least one model serves and the server is not draining
        (nor stopping after an unrecoverable fault).

        A model that failed to load does not make the server unready (the others serve); it is
        listed under ``failed`` with its error. A server with no model to serve says why in
        ``reason``: what its repository holds and the layout expected, or each model's error.
        Paths are relative to the model repository.
        """
        readiness = await serving.call(lambda: _readiness(models))
        if not readiness.ready:
            response.status_code = 503
        return readiness

    @app.get("/v1/models", response_model=list[ModelInfo], dependencies=guarded)
    async def list_models() -> list[ModelInfo]:
        return await serving.call(lambda: [models.info(m) for m in models.all()])

    @app.get(
        "/v1/models/{name}",
        response_model=ModelInfo,
        responses={400: {"description": "invalid model name"}, 404: {"description": "unknown model"}},
        dependencies=guarded,
    )
    async def model_metadata(name: str) -> ModelInfo:
        try:
            return await serving.call(lambda: models.info(models.get(name)))
        except InvalidInput as exc:
            raise HTTPException(status_code=400, detail=exc.message) from None
        except ModelNotFound as exc:
            raise HTTPException(status_code=404, detail=exc.message) from None

    @app.get("/v1/spark/applications", dependencies=guarded)
    async def spark_applications() -> dict[str, object]:
        """The Spark applications seen recently, with their totals (at most max_tracked_apps)."""
        tracked = metrics.applications
        return await serving.call(
            lambda: {
                "max_tracked_apps": tracked.max_tracked_apps,
                "evicted": tracked.evicted,
                "applications": tracked.listing(),
            }
        )

    @app.get("/metrics", response_class=Response, dependencies=guarded)
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus text, rendered after the scrape arrived; scrapes close together share a render.
        Compressed with gzip for a scraper that accepts it (``Accept-Encoding``)."""
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            return Response(
                content=await page.page(gzipped=True), media_type=CONTENT_TYPE_LATEST, headers=GZIPPED
            )
        return Response(content=await page.page(), media_type=CONTENT_TYPE_LATEST, headers=VARY)

    return app


def _readiness(models: ModelTable) -> Readiness:
    """Read on the serving loop, which owns the model table."""
    heads = models.all()
    states: dict[str, str] = {m.name: m.state for m in heads}
    errors = {m.name: models.info(m).error for m in heads}
    failed = {name: without_server_paths(error, models.repository) for name, error in errors.items() if error}
    if models.fault:
        reason = without_server_paths(
            f"unrecoverable fault, the server exits to be restarted: {models.fault}", models.repository
        )
    elif models.draining:
        reason = "draining"
    elif not models.loading_done.is_set():
        reason = "loading models"
    else:
        reason = without_server_paths(models.not_serving_reason(), models.repository)
    return Readiness(
        ready=not reason,
        reason=reason or "ok",
        models=states,
        failed=failed,
        versions=models.served_version_numbers(),
    )

"""The status HTTP API: every net and job at a glance, enqueue and abort, health, metrics.

Served by uvicorn (`fl-dispatcher api`, or
`uvicorn --factory app.entrypoints.api:app_from_env`). Read routes (the nets page among
them) are open; mutating
routes need `X-API-Key: $API_SECRET` and are disabled while API_SECRET is unset.

This module is the HTTP door only: routing, authentication, error handlers. What a route
answers is a read model (`app.read_models`) a use case built, the object the CLI and the
Celery tasks serialise too. `GET /fl/status` probes each net's driver and admin server in
parallel with a deadline (`app.parallel.Prober`), so one hung or unreachable net costs the
response at most the deadline, never more per net.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Query, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from fastapi.security import APIKeyHeader
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.entrypoints import drain_routes, nets_page, prewarm_routes
from app.entrypoints.api_errors import Refused, install_error_handlers
from app.entrypoints.limits import BodySizeLimit
from app.entrypoints.responses import Health, Readiness, error_responses, json_errors
from app.errors import InvalidRequest, quoted
from app.metrics.exposition import build_registry
from app.parallel import Prober
from app.payload_json import loads_payload
from app.read_models import (
    AbortRequested,
    Enqueued,
    FlStatus,
    JobDetail,
    JobList,
    RejectedEvent,
    StateChangeEvent,
)
from app.readiness import check_ready
from app.runtime import Runtime
from app.schemas import EnqueueJob, StorableText
from app.usecases import intake
from app.usecases.net_history import nets_as_declared, nets_overview
from app.usecases.views import (
    collect_status,
    job_detail,
    job_detail_by_key,
    page_jobs,
    parse_job_state,
)

log = logging.getLogger(__name__)

# Per-net probe deadline for /fl/status. Short: an operator page must answer even when every
# server is down; a real admin login that takes longer is itself worth seeing as a timeout.
PROBE_TIMEOUT_S = 3.0
# Deadline for each /readyz dependency check.
READY_TIMEOUT_S = 3.0
JOBS_PAGE_MAX = 1000
# The mutating routes' credential, declared as an OpenAPI API-key scheme so generated
# clients know to send it; checked by hand (auto_error=False) for our own 401/403 words.
API_KEY = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="equal to API_SECRET", scheme_name="ApiKey"
)

M = TypeVar("M", bound=BaseModel)


# --- the app -----------------------------------------------------------------------------


class AbortBody(BaseModel):
    """Optional body of POST /jobs/{id}/abort."""

    model_config = ConfigDict(extra="forbid")
    # Kept in the job's history: one PostgreSQL cannot hold is refused as a field (422).
    reason: StorableText = Field(default="aborted via the status API", max_length=500)


@dataclass(frozen=True)
class _Context:
    runtime: Runtime
    prober: Prober
    probe_timeout_s: float
    ready_timeout_s: float


def create_app(
    runtime: Runtime,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
    ready_timeout_s: float = READY_TIMEOUT_S,
    close_runtime: bool = False,
) -> FastAPI:
    """The status API for `runtime`. Enqueue and abort send their follow-up tasks through
    `runtime.outbox` after commit: a `CeleryOutbox` when served (`app_from_env`,
    `fl-dispatcher api`), a `RecordingOutbox` in tests. `close_runtime`: the app owns the
    runtime and closes its admin sessions and engine at shutdown."""
    prober = Prober()
    ctx = _Context(
        runtime=runtime,
        prober=prober,
        probe_timeout_s=probe_timeout_s,
        ready_timeout_s=ready_timeout_s,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if close_runtime:
            runtime.close()

    app = FastAPI(
        title="fl-dispatcher",
        summary="Federated-learning job queue and per-net NVFLARE server scaling",
        lifespan=lifespan,
    )
    # Outermost: an oversized body is refused before anything reads or parses it.
    app.add_middleware(BodySizeLimit, max_bytes=runtime.settings.api_max_body_bytes)
    app.state.runtime = runtime
    app.state.prober = prober
    install_error_handlers(app)
    _install_health_routes(app, ctx)
    _install_status_routes(app, ctx)
    _install_job_routes(app, ctx)
    prewarm_routes.install(app, ctx.runtime, _api_key_check(ctx), _read_body)
    drain_routes.install(app, ctx.runtime, _api_key_check(ctx), _read_body)
    _install_webhooks(app)
    return app


def _install_webhooks(app: FastAPI) -> None:
    """The status callbacks, as OpenAPI 3.1 `webhooks`: what CALLBACK_URL receives, POSTed
    and signed (Standard Webhooks; the `signature` of `fl-dispatcher schema`). Documentation
    only: these are requests the dispatcher makes, not routes it serves."""

    @app.webhooks.post("state_change", operation_id="callback_state_change", status_code=200)
    def state_change(event: StateChangeEvent) -> None:
        """A job moved (one row of its history); any 2xx acknowledges it."""

    @app.webhooks.post("rejected", operation_id="callback_rejected", status_code=200)
    def rejected(event: RejectedEvent) -> None:
        """An enqueue was refused and created no job; any 2xx acknowledges it."""


def _install_health_routes(app: FastAPI, ctx: _Context) -> None:
    registry = build_registry(
        ctx.runtime.sessions,
        ctx.runtime.clock,
        callbacks=ctx.runtime.settings.callbacks_enabled,
        idle_grace_s={
            n.name: n.idle_timeout_s for n in ctx.runtime.settings.nets if n.scales_to_zero
        },
    )
    broker_url = ctx.runtime.settings.broker_url

    @app.get("/healthz", tags=["health"], response_model=Health, operation_id="get_health")
    def healthz() -> dict[str, str]:
        """The process is up (no dependency checked)."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        operation_id="get_readiness",
        response_model=Readiness,
        response_model_exclude_none=True,
        responses={503: {"model": Readiness, "description": "A dependency is unreachable."}},
    )
    def readyz(response: Response) -> dict[str, Any]:
        """The database answers SELECT 1 and the broker accepts a connection; 503 naming
        the failed one otherwise."""
        found = check_ready(ctx.runtime.engine, broker_url, ctx.prober, ctx.ready_timeout_s)
        checks = {key: error or "ok" for key, error in found.items()}
        failed = sorted(k for k, v in checks.items() if v != "ok")
        if failed:
            response.status_code = 503
            return {"status": "unavailable", "failed": failed, "checks": checks}
        return {"status": "ok", "checks": checks}

    @app.get(
        "/metrics",
        tags=["health"],
        operation_id="get_metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus text exposition format."}},
    )
    def metrics() -> Response:
        """Prometheus text, computed from SQL at scrape time."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _install_status_routes(app: FastAPI, ctx: _Context) -> None:
    settings = ctx.runtime.settings
    callbacks = settings.callbacks_enabled
    detail = partial(job_detail, callbacks=callbacks, settings=settings)
    detail_by_key = partial(job_detail_by_key, callbacks=callbacks, settings=settings)
    declared = nets_as_declared(settings)
    declared_names = {n.name for n in declared}

    @app.get(
        "/fl/status",
        tags=["status"],
        operation_id="get_fl_status",
        response_model=FlStatus,
        responses=error_responses(503),
    )
    def fl_status() -> FlStatus:
        """Every configured net and the queue; a failing net reports its own error."""
        return collect_status(ctx.runtime, ctx.prober, ctx.probe_timeout_s)

    @app.get(
        "/nets",
        tags=["status"],
        operation_id="get_nets_page",
        response_class=HTMLResponse,
        responses={
            200: {"description": "The nets page (HTML, self-contained)."},
            **json_errors(400, 422, 503),
        },
    )
    def get_nets_page(
        net: Annotated[str | None, Query(description="one declared net only")] = None,
        page: Annotated[int, Query(ge=1, description="of 50 nets, those in trouble first")] = 1,
    ) -> HTMLResponse:
        """Every net's last 24 h, current job, queue, cold starts, idle grace and last
        error, and the recent jobs with their history; reloads itself."""
        if net is not None and net not in declared_names:
            raise InvalidRequest(f"unknown net {quoted(net)}")
        with ctx.runtime.sessions() as session:
            overview = nets_overview(session, declared, ctx.runtime.clock(), net=net, page=page)
        return HTMLResponse(nets_page.render(overview))

    @app.get(
        "/jobs",
        tags=["jobs"],
        operation_id="list_jobs",
        response_model=JobList,
        responses=error_responses(400, 422, 503),
    )
    def get_jobs(
        state: Annotated[str | None, Query(description="a job state, any case")] = None,
        limit: Annotated[int, Query(ge=1, le=JOBS_PAGE_MAX, description="page size")] = 100,
        cursor: Annotated[
            str | None, Query(description="`next_cursor` of the previous page; omit for the first")
        ] = None,
        caller_key: Annotated[
            str | None, Query(description="only the job this caller_key names")
        ] = None,
    ) -> JobList:
        """Jobs, newest first, a page at a time (`next_cursor` is null on the last page)."""
        wanted = parse_job_state(state) if state is not None else None
        with ctx.runtime.sessions() as session:
            return page_jobs(session, wanted, limit, cursor=cursor, caller_key=caller_key)

    @app.get(
        "/jobs/by-key/{caller_key:path}",
        tags=["jobs"],
        operation_id="get_job_by_caller_key",
        response_model=JobDetail,
        responses=error_responses(404, 410, 503),
    )
    def get_job_by_key(caller_key: str) -> JobDetail:
        """The job a caller_key names, with its history (410: its enqueue was refused)."""
        with ctx.runtime.sessions() as session:
            return detail_by_key(session, caller_key, now=ctx.runtime.clock())

    @app.get(
        "/jobs/{job_id}",
        tags=["jobs"],
        operation_id="get_job",
        response_model=JobDetail,
        responses=error_responses(404, 410, 422, 503),
    )
    def get_job(job_id: uuid.UUID) -> JobDetail:
        """One job with its history."""
        with ctx.runtime.sessions() as session:
            return detail(session, job_id, now=ctx.runtime.clock())


async def _read_body(request: Request, model: type[M], *, optional: bool) -> M:
    # Parsed in the handler, after the key check, so an unauthenticated caller gets a 401
    # whatever it sent, and malformed JSON is a 422 with a message.
    raw = await request.body()
    if not raw.strip():
        if optional:
            return model()
        raise RequestValidationError(
            [{"loc": ["body"], "msg": "a JSON body is required", "type": "missing"}]
        )
    try:
        data = loads_payload(raw)  # a huge number, deep nesting: marked, refused below
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise RequestValidationError(
            [{"loc": ["body"], "msg": f"not valid JSON: {exc}", "type": "json_invalid"}]
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors()]
        raise RequestValidationError(errors) from None


def _api_key_check(ctx: _Context) -> Any:
    settings = ctx.runtime.settings

    def require_api_key(x_api_key: Annotated[str | None, Security(API_KEY)] = None) -> None:
        secret = settings.api_secret.get_secret_value()
        if not secret:
            raise Refused(403, "mutating routes are disabled: API_SECRET is unset")
        if x_api_key is None or not hmac.compare_digest(
            x_api_key.encode("utf-8"), secret.encode("utf-8")
        ):
            raise Refused(401, "missing or wrong X-API-Key header")

    return require_api_key


def _install_job_routes(app: FastAPI, ctx: _Context) -> None:
    runtime = ctx.runtime
    require_api_key = _api_key_check(ctx)

    @app.post(
        "/jobs",
        tags=["jobs"],
        operation_id="enqueue_job",
        status_code=201,
        dependencies=[Depends(require_api_key)],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": EnqueueJob.model_json_schema()}},
            }
        },
        response_model=Enqueued,
        responses={
            200: {
                "model": Enqueued,
                "description": "The caller key already named a job: that job.",
            },
            **error_responses(400, 401, 403, 409, 413, 422, 503),
        },
    )
    async def post_job(request: Request, response: Response) -> Enqueued:
        """Enqueue a job (idempotent on caller_key): 201 created, 200 existing."""
        payload = await _read_body(request, EnqueueJob, optional=False)
        # A W3C traceparent the caller sent continues its trace (TRACES=true; app/traces.py).
        trace = request.headers.get("traceparent")
        submitted = await run_in_threadpool(intake.submit_job, runtime, payload, trace)
        result = submitted.enqueued
        response.status_code = 201 if result.created else 200
        response.headers["Location"] = f"/jobs/{result.job_id}"
        return submitted.answer()

    @app.post(
        "/jobs/{job_id}/abort",
        tags=["jobs"],
        operation_id="abort_job",
        dependencies=[Depends(require_api_key)],
        openapi_extra={
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": AbortBody.model_json_schema()}},
            }
        },
        response_model=AbortRequested,
        responses=error_responses(401, 403, 404, 409, 413, 422, 503),
    )
    async def post_abort(job_id: uuid.UUID, request: Request) -> AbortRequested:
        """Abort a job: QUEUED/ASSIGNED at once; an active job is ABORTING and a worker
        aborts its run on the server (`abort_on_server`, sent after commit)."""
        body = await _read_body(request, AbortBody, optional=True)
        requested = await run_in_threadpool(intake.request_abort, runtime, job_id, body.reason)
        return requested.answer()


def app_from_env() -> FastAPI:
    """The app for `uvicorn --factory app.entrypoints.api:app_from_env` (settings from env)."""
    from app.celery_app import celery_runtime
    from app.errors import SettingsError
    from app.logs import configure_logging
    from app.settings import load_settings

    try:
        settings = load_settings()
        configure_logging(settings)
    except SettingsError as exc:
        raise SystemExit(f"fl-dispatcher: {exc}") from None
    return create_app(celery_runtime(settings), close_runtime=True)


def iter_routes(app: FastAPI) -> Iterator[tuple[str, str]]:
    """(method, path) of every route the app serves, for docs and tests."""
    for route in app.routes:
        methods: set[str] = getattr(route, "methods", None) or set()
        for method in sorted(methods - {"HEAD"}):
            # path_format drops converters ("{caller_key:path}" is "{caller_key}"), as the
            # OpenAPI document names the path.
            yield method, getattr(route, "path_format", getattr(route, "path", ""))

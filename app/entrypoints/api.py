"""The status HTTP API: every net and job at a glance, enqueue and abort, health, metrics.

Served by uvicorn (`fl-dispatcher api`, or
`uvicorn --factory app.entrypoints.api:app_from_env`). Read
routes are open; mutating routes need `X-API-Key: $API_SECRET` and are disabled while
API_SECRET is unset. Routes call the same use cases as the Celery tasks (`app.usecases.services`)
and send follow-up tasks by name only after their transaction has committed.

`GET /fl/status` probes each net's driver and admin server in parallel with a deadline, so
one hung or unreachable net costs the response at most the deadline, never more per net.
The admin server of a net that is STOPPED and scaled to zero is not contacted: its
`server_state` is reported as `not_probed` (contacting it would only say "unreachable",
which is that net's normal state, and must not count as an outage).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from kombu.exceptions import KombuError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from app.adapters.drivers import Observation
from app.adapters.nvflare.base import ServerState
from app.db import unit_of_work
from app.errors import InvalidRequest, MisconfigurationError, NotFound
from app.metrics import build_registry
from app.runtime import Runtime
from app.schemas import AbortJob, EnqueueJob
from app.settings import redact_url
from app.usecases import services
from models import (
    ACTIVE_JOB_STATES,
    IllegalTransition,
    Job,
    JobEvent,
    JobState,
    Net,
    NetState,
    ScaleEvent,
)

log = logging.getLogger(__name__)

# Per-net probe deadline for /fl/status. Short: an operator page must answer even when every
# server is down; a real admin login that takes longer is itself worth seeing as a timeout.
PROBE_TIMEOUT_S = 3.0
# Deadline for each /readyz dependency check.
READY_TIMEOUT_S = 3.0
JOBS_PAGE_MAX = 1000

# Celery task names (the pipeline owner's tasks, sent by name so the API imports no tasks).
ASSIGN_TASK = "fl_dispatcher.assign_next_job"
ABORT_TASK = "fl_dispatcher.abort_job"

NOT_PROBED = "not_probed"  # server_state of a STOPPED scale-to-zero net: not contacted
UNKNOWN = "unknown"  # server_state when the probe failed or timed out (see `error`)

SendTask = Callable[[str, dict[str, Any]], None]
M = TypeVar("M", bound=BaseModel)


def celery_send_task(broker_url: str) -> SendTask:
    """Send a task by name through the broker, on the queue the workers consume (tasks sent
    to Celery's default queue would sit there unread); the Celery app is built on first use."""
    lock = threading.Lock()
    holder: list[Any] = []

    def send(name: str, kwargs: dict[str, Any]) -> None:
        from celery import Celery

        from app.names import QUEUE

        with lock:
            if not holder:
                app = Celery("fl_dispatcher_api", broker=broker_url)
                app.conf.update(task_serializer="json", accept_content=["json"])
                holder.append(app)
        holder[0].send_task(name, kwargs=kwargs, queue=QUEUE)

    return send


# --- probing with a deadline -------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """A probe's value, or the error string that replaces it."""

    value: Any = None
    error: str | None = None


def describe_error(exc: BaseException) -> str:
    """A one-line error for an operator; a misconfiguration says so first."""
    # redact_url: an endpoint in an adapter's message may carry credentials.
    if isinstance(exc, MisconfigurationError):
        return redact_url(f"misconfigured: {exc}")
    return redact_url(f"{type(exc).__name__}: {exc}")


class Prober:
    """Runs probes in parallel, waiting at most a deadline for all of them.

    Each probe runs on its own daemon thread rather than a ThreadPoolExecutor: an
    executor's workers are joined at interpreter exit, so one admin login hung on a
    black-holed address would keep `fl-dispatcher status` or a stopping API from exiting.
    A probe that overruns keeps its thread (Python cannot kill one); while it is still
    running the same key is not probed again, so a hung server holds at most one thread per
    key, not one per request. Probes never queue behind each other, so the response time
    does not grow with the number of unreachable nets.
    """

    def __init__(self) -> None:
        self._inflight: dict[str, Future[Any]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _start(key: str, call: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()

        def target() -> None:
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - what an executor does: the waiter reports it
                future.set_exception(exc)

        threading.Thread(target=target, name=f"probe {key}", daemon=True).start()
        return future

    def run(
        self, calls: Mapping[str, Callable[[], Any]], timeout_s: float
    ) -> dict[str, ProbeResult]:
        """Start every call, wait until all are done or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        results: dict[str, ProbeResult] = {}
        started: dict[str, Future[Any]] = {}
        with self._lock:
            for key, call in calls.items():
                previous = self._inflight.get(key)
                if previous is not None and not previous.done():
                    results[key] = ProbeResult(
                        error="probe timed out (previous probe still running)"
                    )
                    continue
                started[key] = self._inflight[key] = self._start(key, call)
        wait_futures(started.values(), timeout=max(0.0, deadline - time.monotonic()))
        for key, future in started.items():
            if not future.done():
                results[key] = ProbeResult(error="probe timed out")
            elif (exc := future.exception()) is not None:
                results[key] = ProbeResult(error=describe_error(exc))
            else:
                results[key] = ProbeResult(value=future.result())
        return results

    def hung(self) -> list[str]:
        """Keys whose last probe is still running."""
        with self._lock:
            return sorted(k for k, f in self._inflight.items() if not f.done())


# --- read models shared by the API and the CLI ------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def job_view(job: Job) -> dict[str, Any]:
    """A job as the API and the CLI show it."""
    return {
        "id": str(job.id),
        "caller_key": job.caller_key,
        "state": job.state.value,
        "definition": job.definition,
        "required_sites": list(job.required_sites),
        "requested_net": job.requested_net,
        "net": job.net_name,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "retries": job.retries,
        "nvflare_job_id": job.nvflare_job_id,
        "last_error": job.last_error,
        "created_at": _iso(job.created_at),
        "state_changed_at": _iso(job.state_changed_at),
        "assigned_at": _iso(job.assigned_at),
        "dispatched_at": _iso(job.dispatched_at),
        "finished_at": _iso(job.finished_at),
    }


def job_detail(session: Session, job_id: uuid.UUID) -> dict[str, Any]:
    """A job with its full history, oldest move first; NotFound if there is no such job."""
    job = services.get_job(session, job_id)
    events = session.scalars(
        select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.at, JobEvent.id)
    )
    view = job_view(job)
    view["history"] = [
        {
            "from_state": e.from_state.value if e.from_state is not None else None,
            "to_state": e.to_state.value,
            "at": _iso(e.at),
            "reason": e.reason,
        }
        for e in events
    ]
    return view


def parse_job_state(raw: str) -> JobState:
    """A job state from user input (any case); InvalidRequest naming the accepted values."""
    try:
        return JobState(raw.strip().upper())
    except ValueError:
        accepted = ", ".join(s.value for s in JobState)
        raise InvalidRequest(f"unknown job state {raw!r}; expected one of: {accepted}") from None


def list_jobs(session: Session, state: JobState | None, limit: int) -> list[dict[str, Any]]:
    """Jobs, newest first, optionally in one state."""
    stmt = select(Job).order_by(Job.created_at.desc(), Job.id).limit(limit)
    if state is not None:
        stmt = stmt.where(Job.state == state)
    return [job_view(job) for job in session.scalars(stmt)]


@dataclass(frozen=True)
class _NetRow:
    state: NetState
    state_changed_at: datetime
    idle_since: datetime | None
    last_error: str | None


def _sql_view(session: Session, names: Sequence[str]) -> dict[str, Any]:
    nets = {
        n.name: _NetRow(n.state, n.state_changed_at, n.idle_since, n.last_error)
        for n in session.scalars(select(Net).where(Net.name.in_(names)))
    }
    active = {
        j.net_name: {
            "id": str(j.id),
            "caller_key": j.caller_key,
            "state": j.state.value,
            "nvflare_job_id": j.nvflare_job_id,
            "state_changed_at": _iso(j.state_changed_at),
        }
        for j in session.scalars(
            select(Job).where(Job.net_name.in_(names), Job.state.in_(ACTIVE_JOB_STATES))
        )
    }
    latest = (
        select(func.max(ScaleEvent.id))
        .where(ScaleEvent.net_name.in_(names))
        .group_by(ScaleEvent.net_name)
        .scalar_subquery()
    )
    scale = {
        e.net_name: {
            "action": e.action,
            "replicas": e.replicas,
            "outcome": e.outcome,
            "reason": e.reason,
            "at": _iso(e.at),
        }
        for e in session.scalars(select(ScaleEvent).where(ScaleEvent.id.in_(latest)))
    }
    queued, oldest = session.execute(
        select(func.count(), func.min(Job.created_at)).where(Job.state == JobState.QUEUED)
    ).one()
    return {"nets": nets, "active": active, "scale": scale, "queued": queued, "oldest": oldest}


def _observe(runtime: Runtime, name: str) -> Observation:
    return runtime.driver(name).observe()


def _server(runtime: Runtime, name: str) -> tuple[ServerState, list[str] | None]:
    admin = runtime.admin(name)
    state = admin.server_state()
    sites = sorted(admin.connected_sites()) if state == ServerState.STARTED else None
    return state, sites


def collect_status(runtime: Runtime, prober: Prober | None, timeout_s: float) -> dict[str, Any]:
    """Every configured net (SQL state, driver view, server state, sites, active job, last
    scale event) and the queue. `prober=None` skips the driver and admin probes (SQL only).

    A net's probe failure or timeout lands in that net's `error`; only the database being
    unreachable fails the whole call.
    """
    settings = runtime.settings
    names = [n.name for n in settings.nets]
    with runtime.sessions() as session:
        sql = _sql_view(session, names)

    calls: dict[str, Callable[[], Any]] = {}
    probe_admin: dict[str, bool] = {}
    for net in settings.nets:
        row: _NetRow | None = sql["nets"].get(net.name)
        always_on = net.always_on
        # A scaled-to-zero server is not contacted: down is its normal state.
        probe_admin[net.name] = always_on or (row is not None and row.state != NetState.STOPPED)
        if prober is None:
            continue
        calls[f"driver:{net.name}"] = partial(_observe, runtime, net.name)
        if probe_admin[net.name]:
            calls[f"admin:{net.name}"] = partial(_server, runtime, net.name)
    results = prober.run(calls, timeout_s) if prober is not None else {}

    views = []
    for net in settings.nets:
        row = sql["nets"].get(net.name)
        errors = []
        if row is None:
            errors.append("no database row yet (the worker creates it at start)")
        driver_view: dict[str, Any] | None = None
        server_state = NOT_PROBED
        sites: list[str] | None = None
        if prober is not None:
            observed = results[f"driver:{net.name}"]
            if observed.error is not None:
                errors.append(f"driver: {observed.error}")
            else:
                obs: Observation = observed.value
                driver_view = {
                    "desired": obs.desired,
                    "running": obs.running,
                    "pending": obs.pending,
                    "failure": obs.failure,
                }
            if probe_admin[net.name]:
                probed = results[f"admin:{net.name}"]
                if probed.error is not None:
                    server_state = UNKNOWN
                    errors.append(f"admin: {probed.error}")
                else:
                    state, sites = probed.value
                    server_state = state.value
        views.append(
            {
                "name": net.name,
                "state": row.state.value if row else None,
                "state_changed_at": _iso(row.state_changed_at) if row else None,
                "idle_since": _iso(row.idle_since) if row else None,
                "always_on": net.always_on,
                "driver_kind": net.driver.kind,
                "driver": driver_view,
                "server_state": server_state,
                "connected_sites": sites,
                "required_sites": list(net.required_sites),
                "active_job": sql["active"].get(net.name),
                "last_scale_event": sql["scale"].get(net.name),
                "last_error": row.last_error if row else None,
                "error": "; ".join(errors) or None,
            }
        )
    return {
        "generated_at": _iso(runtime.clock()),
        "probed": prober is not None,
        "probe_timeout_s": timeout_s,
        "queue": {"queued": sql["queued"], "oldest_queued_at": _iso(sql["oldest"])},
        "nets": views,
    }


# --- the app -----------------------------------------------------------------------------


class AbortBody(BaseModel):
    """Optional body of POST /jobs/{id}/abort."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="aborted via the status API", max_length=500)


@dataclass(frozen=True)
class _Context:
    runtime: Runtime
    send_task: SendTask
    prober: Prober
    probe_timeout_s: float
    ready_timeout_s: float


def create_app(
    runtime: Runtime,
    send_task: SendTask | None = None,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
    ready_timeout_s: float = READY_TIMEOUT_S,
    close_runtime: bool = False,
) -> FastAPI:
    """The status API for `runtime`. `send_task(name, kwargs)` sends a Celery task by name
    (default: through `settings.broker_url`); tests pass a recorder. `close_runtime`: the
    app owns the runtime and closes its admin sessions and engine at shutdown."""
    prober = Prober()
    ctx = _Context(
        runtime=runtime,
        send_task=send_task or celery_send_task(runtime.settings.broker_url),
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
    app.state.runtime = runtime
    app.state.prober = prober
    _install_error_handlers(app)
    _install_health_routes(app, ctx)
    _install_status_routes(app, ctx)
    _install_job_routes(app, ctx)
    return app


def _error(status: int, detail: str, **more: Any) -> JSONResponse:
    return JSONResponse({"detail": detail, **more}, status_code=status)


def _validation_response(errors: Sequence[Any]) -> JSONResponse:
    # The message names each field and what is wrong; the input is not echoed back.
    items = [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors
    ]
    detail = "; ".join(f"{'.'.join(i['loc']) or 'body'}: {i['msg']}" for i in items)
    return _error(422, detail or "invalid request", errors=items)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc.errors())

    @app.exception_handler(_Refused)
    async def _refused(_: Request, exc: _Refused) -> JSONResponse:
        headers = {"WWW-Authenticate": "X-API-Key"} if exc.status == 401 else None
        return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=headers)

    @app.exception_handler(IllegalTransition)
    async def _conflict(_: Request, exc: IllegalTransition) -> JSONResponse:
        return _error(409, f"{exc}; the job changed meanwhile, read it again")

    @app.exception_handler(StaleDataError)
    async def _stale(_: Request, exc: StaleDataError) -> JSONResponse:
        return _error(409, "the row was changed by another process meanwhile; retry")

    @app.exception_handler(DBAPIError)
    async def _db_down(_: Request, exc: DBAPIError) -> JSONResponse:
        # The driver's message can quote SQL and parameters: log it, answer generically.
        log.error("database error", exc_info=exc)
        return _error(503, "database unavailable or failing; see the API log")


def _install_health_routes(app: FastAPI, ctx: _Context) -> None:
    registry = build_registry(ctx.runtime.sessions, ctx.runtime.clock)
    broker_url = ctx.runtime.settings.broker_url

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """The process is up (no dependency checked)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz() -> JSONResponse:
        """The database answers SELECT 1 and the broker accepts a connection; 503 naming
        the failed one otherwise."""
        results = ctx.prober.run(
            {
                "ready:database": partial(check_database, ctx.runtime),
                "ready:broker": partial(check_broker, broker_url, ctx.ready_timeout_s),
            },
            ctx.ready_timeout_s,
        )
        checks = {
            key.removeprefix("ready:"): "ok" if r.error is None else r.error
            for key, r in results.items()
        }
        failed = sorted(k for k, v in checks.items() if v != "ok")
        if failed:
            return JSONResponse(
                {"status": "unavailable", "failed": failed, "checks": checks}, status_code=503
            )
        return JSONResponse({"status": "ok", "checks": checks})

    @app.get("/metrics", tags=["health"])
    def metrics() -> Response:
        """Prometheus text, computed from SQL at scrape time."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _install_status_routes(app: FastAPI, ctx: _Context) -> None:
    @app.get("/fl/status", tags=["status"])
    def fl_status() -> dict[str, Any]:
        """Every configured net and the queue; a failing net reports its own error."""
        return collect_status(ctx.runtime, ctx.prober, ctx.probe_timeout_s)

    @app.get("/jobs", tags=["jobs"])
    def get_jobs(
        state: Annotated[str | None, Query(description="a job state, any case")] = None,
        limit: Annotated[int, Query(ge=1, le=JOBS_PAGE_MAX)] = 100,
    ) -> dict[str, Any]:
        """Jobs, newest first."""
        wanted = parse_job_state(state) if state is not None else None
        with ctx.runtime.sessions() as session:
            return {"jobs": list_jobs(session, wanted, limit)}

    @app.get("/jobs/{job_id}", tags=["jobs"])
    def get_job(job_id: uuid.UUID) -> dict[str, Any]:
        """One job with its history."""
        with ctx.runtime.sessions() as session:
            return job_detail(session, job_id)


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
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestValidationError(
            [{"loc": ["body"], "msg": f"not valid JSON: {exc}", "type": "json_invalid"}]
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors()]
        raise RequestValidationError(errors) from None


def _notify(ctx: _Context, name: str, kwargs: dict[str, Any]) -> bool:
    # Called after commit. A lost message loses nothing (the reconciler finds the row
    # again), so a broker failure is logged and reported, never turned into an error.
    try:
        ctx.send_task(name, kwargs)
    except (KombuError, OSError) as exc:
        log.warning("sending a task failed", extra={"task": name, "reason": str(exc)})
        return False
    return True


def _install_job_routes(app: FastAPI, ctx: _Context) -> None:
    runtime = ctx.runtime
    settings = runtime.settings

    def require_api_key(
        x_api_key: Annotated[str | None, Header(description="equal to API_SECRET")] = None,
    ) -> None:
        secret = settings.api_secret.get_secret_value()
        if not secret:
            raise _Refused(403, "mutating routes are disabled: API_SECRET is unset")
        if x_api_key is None or not hmac.compare_digest(
            x_api_key.encode("utf-8"), secret.encode("utf-8")
        ):
            raise _Refused(401, "missing or wrong X-API-Key header")

    def enqueue(payload: EnqueueJob) -> services.Enqueued:
        with unit_of_work(runtime.sessions) as session:
            ensure_net_rows(session, runtime)
            return services.enqueue_job(session, settings, payload, runtime.clock())

    def abort(payload: AbortJob) -> services.AbortDecision:
        with unit_of_work(runtime.sessions) as session:
            return services.abort_job(session, payload.job_id, payload.reason, runtime.clock())

    @app.post(
        "/jobs",
        tags=["jobs"],
        status_code=201,
        dependencies=[Depends(require_api_key)],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": EnqueueJob.model_json_schema()}},
            }
        },
        responses={200: {"description": "The caller key already named a job: that job."}},
    )
    async def post_job(request: Request) -> JSONResponse:
        """Enqueue a job (idempotent on caller_key): 201 created, 200 existing."""
        payload = await _read_body(request, EnqueueJob, optional=False)
        result = await run_in_threadpool(enqueue, payload)
        notified = None
        if result.state == JobState.QUEUED:
            # Also for an existing QUEUED job: the caller's retry may follow a lost message.
            notified = await run_in_threadpool(_notify, ctx, ASSIGN_TASK, {})
        return JSONResponse(
            {
                "job_id": str(result.job_id),
                "state": result.state.value,
                "created": result.created,
                "notified": notified,
            },
            status_code=201 if result.created else 200,
            headers={"Location": f"/jobs/{result.job_id}"},
        )

    @app.post(
        "/jobs/{job_id}/abort",
        tags=["jobs"],
        dependencies=[Depends(require_api_key)],
        openapi_extra={
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": AbortBody.model_json_schema()}},
            }
        },
    )
    async def post_abort(job_id: uuid.UUID, request: Request) -> dict[str, Any]:
        """Abort a job: QUEUED/ASSIGNED at once; an active job through its server (the
        abort task is sent after commit)."""
        body = await _read_body(request, AbortBody, optional=True)
        payload = AbortJob(job_id=job_id, reason=body.reason)
        decision = await run_in_threadpool(abort, payload)
        notified = None
        if decision.needs_server_abort:
            # The public task takes its payload like flip-api sends it (app.client); it
            # re-reads the job (ABORTING) and aborts the run on its server.
            notified = await run_in_threadpool(
                _notify, ctx, ABORT_TASK, {"payload": payload.model_dump(mode="json")}
            )
        return {
            "job_id": str(decision.job_id),
            "state": decision.state.value,
            "needs_server_abort": decision.needs_server_abort,
            "notified": notified,
        }


class _Refused(Exception):
    """An authentication refusal (401 or 403) with its message."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def ensure_net_rows(session: Session, runtime: Runtime) -> None:
    """Create the rows of configured nets the workers have not created yet, so a job that
    names a net can be stored (jobs.requested_net references nets.name)."""
    configured = {n.name for n in runtime.settings.nets}
    present = set(session.scalars(select(Net.name).where(Net.name.in_(configured))))
    if present != configured:
        services.sync_nets(session, runtime.settings, runtime.clock())
        session.flush()


def check_database(runtime: Runtime) -> None:
    """SELECT 1 on a pooled connection."""
    with runtime.engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def check_broker(broker_url: str, timeout_s: float) -> None:
    """One connection attempt to the broker, no retry loop."""
    from kombu.connection import Connection

    connection = Connection(broker_url, connect_timeout=timeout_s)  # type: ignore[no-untyped-call]
    with connection as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout_s)


def app_from_env() -> FastAPI:
    """The app for `uvicorn --factory app.entrypoints.api:app_from_env` (settings from env)."""
    from app.errors import SettingsError
    from app.logs import configure_logging
    from app.settings import load_settings

    try:
        settings = load_settings()
        configure_logging(settings)
    except SettingsError as exc:
        raise SystemExit(f"fl-dispatcher: {exc}") from None
    return create_app(Runtime.from_settings(settings), close_runtime=True)


def iter_routes(app: FastAPI) -> Iterator[tuple[str, str]]:
    """(method, path) of every route the app serves, for docs and tests."""
    for route in app.routes:
        methods: set[str] = getattr(route, "methods", None) or set()
        for method in sorted(methods - {"HEAD"}):
            yield method, getattr(route, "path", "")

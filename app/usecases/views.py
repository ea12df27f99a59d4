"""Reading jobs and nets as every door shows them (GET /jobs, GET /fl/status, the CLI's
`jobs`, `job` and `status`): each answer is built once, as its read model
(`app.read_models`), and the HTTP API and the CLI serialise the same object.

Reads only: nothing here writes a row. `collect_status` also probes each net's driver and
admin server, in parallel with a deadline (`app.parallel.Prober`). The admin server of a
net that is STOPPED and scaled to zero is not contacted: its `server_state` is reported as
`not_probed` (contacting it would only say "unreachable", which is that net's normal state,
and must not count as an outage).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, cast

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from app.adapters.backend import ServerState
from app.adapters.drivers import Observation
from app.errors import InvalidRequest, NotFound, RequestRejected, quoted
from app.parallel import Prober, ProbeResult, describe_error
from app.read_models import (
    ActiveJob,
    DriverView,
    FlStatus,
    JobDetail,
    JobEventView,
    JobList,
    JobView,
    NetStatus,
    QueueView,
    ScaleEventView,
    iso,
)
from app.runtime import Runtime
from app.schemas import job_id_for, require_storable
from app.settings import Settings
from app.usecases import enqueue, records
from app.usecases.callbacks import delivery_status
from app.usecases.claims import drained
from app.usecases.drains import NET_DRAINED, drain_state
from app.usecases.prewarm import holds as prewarm_holds
from app.usecases.queue_place import queue_place
from models import (
    ACTIVE_JOB_STATES,
    Job,
    JobEvent,
    JobState,
    Net,
    NetState,
    ScaleEvent,
    StrayRun,
    attempt_number,
    utcnow,
)

NOT_PROBED = "not_probed"  # server_state of a STOPPED scale-to-zero net: not contacted
UNKNOWN = "unknown"  # server_state when the probe failed or timed out (see `error`)


def _job_fields(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "caller_key": job.caller_key,
        "state": job.state,
        "definition": job.definition,
        "required_sites": list(job.required_sites),
        "metadata": job.metadata_,
        "requested_net": job.requested_net,
        "prewarm_key": job.prewarm_key,
        "project_id": job.project_id,
        "net": job.net_name,
        "priority": job.priority,
        "attempt": attempt_number(job.attempts, job.max_attempts),
        "max_attempts": job.max_attempts,
        "attempts": job.attempts,
        "retries": job.retries,
        "nvflare_job_id": job.nvflare_job_id,
        "last_error": job.last_error,
        "reason_code": job.reason_code,
        "created_at": iso(job.created_at),
        "state_changed_at": iso(job.state_changed_at),
        "assigned_at": iso(job.assigned_at),
        "dispatched_at": iso(job.dispatched_at),
        "finished_at": iso(job.finished_at),
    }


def job_view(job: Job) -> JobView:
    """A job as the API and the CLI show it."""
    return JobView(**_job_fields(job))


def job_detail(
    session: Session,
    job_id: uuid.UUID,
    *,
    callbacks: bool = False,
    settings: Settings | None = None,
    now: datetime | None = None,
) -> JobDetail:
    """A job with its full history, oldest move first, and with `callbacks` (CALLBACK_URL
    set) how far that history was delivered to flip-api; a QUEUED job's place in line and
    waiting reason as of `now` (app.usecases.queue_place). RequestRejected if the enqueue
    that would have created it was refused, NotFound if there is no such job at all.
    `settings`: the nets an unpinned job may run on and the shares (else every net the
    database holds, every project weighing 1)."""
    try:
        job = records.get_job(session, job_id)
    except NotFound:
        rejection = enqueue.get_rejection(session, job_id)
        if rejection is None:
            raise
        raise RequestRejected(
            f"job {job_id}: rejected at {iso(rejection.at)}: {rejection.reason}",
            reason_code=rejection.reason_code,
        ) from None
    events = session.scalars(
        select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.at, JobEvent.id)
    )
    history = [
        JobEventView(
            from_state=e.from_state,
            to_state=e.to_state,
            at=e.at.isoformat(),
            reason=e.reason,
            reason_code=e.reason_code,
            attempt=attempt_number(e.attempt, job.max_attempts) if e.attempt is not None else None,
        )
        for e in events
    ]
    queued = job.state == JobState.QUEUED
    place = queue_place(session, job, settings, now or utcnow()) if queued else None
    return JobDetail(
        **_job_fields(job),
        history=history,
        callbacks=delivery_status(session, job_id) if callbacks else None,
        waiting_for=waiting_for(session, job, settings) if queued else None,
        place_in_line=place.place if place is not None else None,
        waiting_reason=place.reason if place is not None else None,
    )


def waiting_for(session: Session, job: Job, settings: Settings | None = None) -> str | None:
    """Why a QUEUED job is not running yet, when something other than a free net holds it:
    an earlier run of it not yet settled, every net it may run on drained ("net drained"),
    or the net it is pinned to out of service."""
    stray = session.scalar(select(StrayRun).where(StrayRun.job_id == job.id).limit(1))
    if stray is not None:
        return f"an earlier run of it on net {stray.net_name} is not settled yet: {stray.reason}"
    shut = _drained_for(session, job, settings)
    if shut is not None:
        return shut
    if job.requested_net is None:
        return None
    net = session.get(Net, job.requested_net)
    if net is not None and net.state in (NetState.MISCONFIGURED, NetState.UNHEALTHY):
        why = f": {net.last_error}" if net.last_error else ""
        return f"net {net.name} is {net.state}{why}"
    return None


def _drained_for(session: Session, job: Job, settings: Settings | None) -> str | None:
    """ "net drained: ..." when every net the job may run on is drained."""
    if job.requested_net is not None:
        candidates = [job.requested_net]
    elif settings is not None:
        candidates = [n.name for n in settings.nets if not n.lacks(job.required_sites)]
    else:
        candidates = list(session.scalars(select(Net.name)))
    if not candidates:
        return None
    shut = set(session.scalars(select(Net.name).where(Net.name.in_(candidates), drained(Net.name))))
    if shut != set(candidates):
        return None
    if job.requested_net is not None:
        which = f"net {job.requested_net}, which it is pinned to, is drained"
    else:
        which = f"every net it may run on is drained ({', '.join(sorted(shut))})"
    return f"{NET_DRAINED}: {which}; it runs once an operator undrains one (`undrain`)"


def parse_job_state(raw: str) -> JobState:
    """A job state from user input (any case); InvalidRequest naming the accepted values."""
    try:
        return JobState(raw.strip().upper())
    except ValueError:
        accepted = ", ".join(s.value for s in JobState)
        raise InvalidRequest(
            f"unknown job state {quoted(raw)}; expected one of: {accepted}"
        ) from None


def list_jobs(session: Session, state: JobState | None, limit: int) -> list[JobView]:
    """Jobs, newest first, optionally in one state (the first page)."""
    return page_jobs(session, state, limit).jobs


def _encode_cursor(job: Job) -> str:
    raw = f"{job.created_at.isoformat()}|{job.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, job_id = raw.split("|")
        at = datetime.fromisoformat(created)
        if at.tzinfo is None:  # every cursor this API returns carries its zone
            raise ValueError("no zone")
        # Compared in UTC: an instant that leaves the calendar there (9999-12-31T23:00-05:00)
        # is no job's, and would only overflow in the column's bind.
        at = at.astimezone(UTC)
        return at, uuid.UUID(job_id)
    except (ValueError, UnicodeDecodeError, OverflowError):
        raise InvalidRequest("cursor is not one this API returned") from None


def page_jobs(
    session: Session,
    state: JobState | None,
    limit: int,
    *,
    cursor: str | None = None,
    caller_key: str | None = None,
) -> JobList:
    """A page of jobs, newest first, and the cursor of the next one (None on the last).
    Keyset pagination on (created_at, id): a job enqueued meanwhile never shifts a page."""
    stmt = select(Job).order_by(Job.created_at.desc(), Job.id).limit(limit + 1)
    if state is not None:
        stmt = stmt.where(Job.state == state)
    if caller_key is not None:
        stmt = stmt.where(Job.caller_key == require_storable(caller_key, "caller_key"))
    if cursor is not None:
        created, after = _decode_cursor(cursor)
        stmt = stmt.where(
            or_(Job.created_at < created, and_(Job.created_at == created, Job.id > after))
        )
    jobs = list(session.scalars(stmt))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return JobList(
        jobs=[job_view(job) for job in jobs],
        next_cursor=_encode_cursor(jobs[-1]) if more else None,
    )


def job_detail_by_key(
    session: Session,
    caller_key: str,
    *,
    callbacks: bool = False,
    settings: Settings | None = None,
    now: datetime | None = None,
) -> JobDetail:
    """The job a caller_key names, as `job_detail` shows it (RequestRejected when its enqueue
    was refused, NotFound when there is neither)."""
    require_storable(caller_key, "caller_key")
    job = session.scalar(select(Job.id).where(Job.caller_key == caller_key))
    try:
        return job_detail(
            session,
            job if job is not None else job_id_for(caller_key),
            callbacks=callbacks,
            settings=settings,
            now=now,
        )
    except RequestRejected:
        raise
    except NotFound:
        raise NotFound(f"no job with caller_key {quoted(caller_key)}") from None


@dataclass(frozen=True)
class _NetRow:
    state: NetState
    state_changed_at: datetime
    idle_since: datetime | None
    last_error: str | None


@dataclass(frozen=True)
class _SqlView:
    nets: dict[str, _NetRow]
    active: dict[str, ActiveJob]
    scale: dict[str, ScaleEventView]
    queued: int
    oldest: datetime | None


def _sql_view(session: Session, names: Sequence[str]) -> _SqlView:
    nets = {
        n.name: _NetRow(n.state, n.state_changed_at, n.idle_since, n.last_error)
        for n in session.scalars(select(Net).where(Net.name.in_(names)))
    }
    active = {
        cast(str, j.net_name): ActiveJob.of(j)
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
        e.net_name: ScaleEventView(
            action=e.action,
            replicas=e.replicas,
            outcome=e.outcome,
            reason=e.reason,
            at=e.at.isoformat(),
        )
        for e in session.scalars(select(ScaleEvent).where(ScaleEvent.id.in_(latest)))
    }
    queued, oldest = session.execute(
        select(func.count(), func.min(Job.created_at)).where(Job.state == JobState.QUEUED)
    ).one()
    return _SqlView(nets, active, scale, queued, oldest)


def _observed(batch_result: ProbeResult, name: str) -> ProbeResult:
    """One net's share of a batch observation (app.runtime.Runtime.observe_many)."""
    if batch_result.error is not None:
        return batch_result
    value = batch_result.value[name]
    if isinstance(value, Exception):
        return ProbeResult(error=describe_error(value))
    return ProbeResult(value=value)


def _server(runtime: Runtime, name: str) -> tuple[ServerState, list[str] | None]:
    admin = runtime.admin(name)
    state = admin.server_state()
    sites = sorted(admin.connected_sites()) if state == ServerState.STARTED else None
    return state, sites


def undeclared_nets(session: Session, declared: Sequence[str]) -> list[str]:
    """Nets the database holds that these settings do not declare: another deployment's
    settings made them (the demo's, say), or NETS no longer lists them."""
    return list(
        session.scalars(select(Net.name).where(Net.name.not_in(declared)).order_by(Net.name))
    )


def collect_status(runtime: Runtime, prober: Prober | None, timeout_s: float) -> FlStatus:
    """Every configured net (SQL state, driver view, server state, sites, active job, last
    scale event, live prewarm hold) and the queue. `prober=None` skips the driver and admin
    probes (SQL only).

    A net's probe failure or timeout lands in that net's `error`; only the database being
    unreachable fails the whole call.
    """
    settings = runtime.settings
    names = [n.name for n in settings.nets]
    with runtime.sessions() as session:
        sql = _sql_view(session, names)
        holds = prewarm_holds.live_holds(session, runtime.clock())
        drain = drain_state(session, names, sql.queued)
    shut = {n.name for n in drain.nets}

    calls: dict[str, Callable[[], Any]] = {}
    probe_admin: dict[str, bool] = {}
    # Drivers are asked in batches: ECS nets of one cluster 10 per DescribeServices call.
    driver_call: dict[str, str] = {}
    for batch in runtime.observation_batches(names) if prober is not None else []:
        key = "driver:" + ",".join(batch)
        calls[key] = partial(runtime.observe_many, batch)
        driver_call |= dict.fromkeys(batch, key)
    for net in settings.nets:
        row: _NetRow | None = sql.nets.get(net.name)
        always_on = net.always_on
        # A scaled-to-zero server is not contacted: down is its normal state.
        probe_admin[net.name] = always_on or (row is not None and row.state != NetState.STOPPED)
        if prober is not None and probe_admin[net.name]:
            calls[f"admin:{net.name}"] = partial(_server, runtime, net.name)
    results = prober.run(calls, timeout_s) if prober is not None else {}

    views = []
    for net in settings.nets:
        row = sql.nets.get(net.name)
        errors = []
        if row is None:
            errors.append("no database row yet (the worker creates it at start)")
        driver_view: DriverView | None = None
        server_state = NOT_PROBED
        sites: list[str] | None = None
        if prober is not None:
            observed = _observed(results[driver_call[net.name]], net.name)
            if observed.error is not None:
                errors.append(f"driver: {observed.error}")
            else:
                obs: Observation = observed.value
                driver_view = DriverView(
                    desired=obs.desired,
                    running=obs.running,
                    pending=obs.pending,
                    failure=obs.failure,
                )
            if probe_admin[net.name]:
                probed = results[f"admin:{net.name}"]
                if probed.error is not None:
                    server_state = UNKNOWN
                    errors.append(f"admin: {probed.error}")
                else:
                    state, sites = probed.value
                    server_state = state.value
        views.append(
            NetStatus(
                name=net.name,
                state=row.state if row else None,
                state_changed_at=iso(row.state_changed_at) if row else None,
                idle_since=iso(row.idle_since) if row else None,
                always_on=net.always_on,
                driver_kind=net.driver.kind,
                driver=driver_view,
                server_state=server_state,
                connected_sites=sites,
                required_sites=list(net.required_sites),
                active_job=sql.active.get(net.name),
                last_scale_event=sql.scale.get(net.name),
                last_error=row.last_error if row else None,
                error="; ".join(errors) or None,
                prewarm=holds[net.name].view() if net.name in holds else None,
                drained=net.name in shut,
            )
        )
    return FlStatus(
        generated_at=runtime.clock().isoformat(),
        probed=prober is not None,
        probe_timeout_s=timeout_s,
        queue=QueueView(queued=sql.queued, oldest_queued_at=iso(sql.oldest)),
        nets=views,
        drain=drain,
    )

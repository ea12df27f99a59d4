"""Use cases on the SQL state: one function per use case.

Each takes an open `Session` (the caller's unit of work commits or rolls back) and an
explicit `now`, and never talks to NVFLARE or a cloud API: those calls live in
`app.usecases.dispatch`, which uses these functions for every state change. Tasks, the CLI, the HTTP
API and the tests all call these same functions.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy import ColumnElement, and_, case, delete, exists, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.s3_definition import parse_s3_definition
from app.errors import CallerKeyConflict, InvalidRequest, NotFound
from app.net_config import NetConfig
from app.schemas import (
    EnqueueJob,
    ReportedStatus,
    ReportJobStatus,
    job_id_for,
    storable,
    unstorable,
)
from app.settings import Settings
from models import (
    ACTIVE_JOB_STATES,
    ASSIGNABLE_NET_STATES,
    TERMINAL_JOB_STATES,
    Job,
    JobState,
    Net,
    NetState,
    ReasonCode,
    RejectedRequest,
    StrayRun,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Enqueued:
    """The job a caller's key maps to, and whether this call created it."""

    job_id: uuid.UUID
    created: bool
    state: JobState


@dataclass(frozen=True)
class Assignment:
    """A job claimed for a net; the caller starts the pipeline after commit."""

    job_id: uuid.UUID
    net_name: str
    net_state: NetState  # the net's state after the claim: STARTING needs a scale-up
    attempt: int = 0  # the job's attempt number: every chain step checks it


def sync_nets(
    session: Session, settings: Settings, now: datetime, *, at_start: bool = False
) -> list[str]:
    """Make sure every configured net has a row; returns the names it created.

    At process start (`at_start`) a MISCONFIGURED net is reset to STOPPED: settings are
    validated at every start, so a restart after a fix is the human saying "try again".
    """
    existing = {n.name: n for n in session.scalars(select(Net).with_for_update())}
    created = []
    for net_config in settings.nets:
        net = existing.get(net_config.name)
        if net is None:
            net = Net(name=net_config.name, state=NetState.STOPPED, state_changed_at=now)
            session.add(net)
            created.append(net_config.name)
        elif (
            at_start
            and net.state == NetState.MISCONFIGURED
            and active_job(session, net.name) is None  # never STOPPED under a job
        ):
            net.transition(NetState.STOPPED, now, "settings reloaded at start")
            net.last_error = None
        net.declared_at = now
    return created


def note_declared(session: Session, settings: Settings, now: datetime) -> None:
    """This process declares these nets now (see `undeclared_nets`)."""
    names = [n.name for n in settings.nets]
    if names:
        session.execute(
            update(Net)
            .where(Net.name.in_(names))
            .values(declared_at=now)
            .execution_options(synchronize_session=False)
        )


def undeclared_nets(session: Session, settings: Settings, now: datetime) -> list[str]:
    """Nets with rows that no process has declared for `undeclared_after_s(settings)`: a
    redeploy removed them. One this process lacks but another declared lately is in the
    middle of a rolling deploy (added, or about to go) and is not among them."""
    declared = [n.name for n in settings.nets]
    since = now - timedelta(seconds=undeclared_after_s(settings))
    return list(
        session.scalars(
            select(Net.name).where(
                Net.name.not_in(declared),
                or_(Net.declared_at.is_(None), Net.declared_at < since),
            )
        )
    )


def undeclared_after_s(settings: Settings) -> float:
    """How long no process may have declared a net before it counts as removed: longer than
    a rolling deploy leaves old and new processes side by side, and than ten reconcile
    rounds (each declares its nets)."""
    return max(settings.stuck_after_s, 20 * settings.housekeeping_interval_s)


def mark_misconfigured(session: Session, name: str, reason: str, now: datetime) -> bool:
    """Take a net out of service until a human fixes its settings (jobs wait QUEUED).
    Returns False when the net has an active job (monitor settles that one first)."""
    net = get_net(session, name, lock=True)
    if active_job(session, name) is not None:
        return False
    net.transition(NetState.MISCONFIGURED, now, reason)
    net.last_error = reason
    return True


def ensure_net_rows(session: Session, settings: Settings, now: datetime) -> None:
    """Create the rows of configured nets no worker has created yet, so a job that names a
    net can be stored (jobs.requested_net references nets.name); cheap when all exist."""
    configured = {n.name for n in settings.nets}
    # Not mutated: this read only spares sync_nets' locked read when every row exists; any
    # wrong answer makes sync_nets run, which creates the same rows.
    present = set(  # pragma: no mutate
        session.scalars(select(Net.name).where(Net.name.in_(configured)))  # pragma: no mutate
    )
    if present != configured:
        sync_nets(session, settings, now)
        session.flush()


def resolve_definition(settings: Settings, definition: str) -> str:
    """Validate a job definition: an `s3://` URI, or a folder inside `JOB_ROOT` that exists.

    Returns the normalised form stored on the job (the path relative to the root).
    """
    if definition.startswith("s3://"):
        return parse_s3_definition(definition).uri  # network-free checks; raises InvalidRequest
    relative = PurePosixPath(definition)
    if relative.is_absolute() or ".." in relative.parts:
        raise InvalidRequest(
            f"definition {definition!r} must be a relative folder under the job root, without '..'"
        )
    root = settings.job_root.resolve()
    folder = (root / relative).resolve()
    # resolve() follows symlinks, so a link pointing outside the root is caught here too.
    if not folder.is_relative_to(root):
        raise InvalidRequest(f"definition {definition!r} escapes the job root")
    if not folder.is_dir():
        raise InvalidRequest(f"definition {definition!r} is not a folder under the job root")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", folder.name):
        # NVFLARE refuses other characters in the job folder's name (2.9.0 submit_job).
        raise InvalidRequest(
            f"definition folder name {folder.name!r} may hold only letters, digits, '.', '_', '-'"
        )
    return str(relative)


def job_folder(settings: Settings, definition: str) -> Path:
    """The local folder of a stored (already validated) definition."""
    return (settings.job_root / definition).resolve()


def enqueue_job(
    session: Session, settings: Settings, request: EnqueueJob, now: datetime
) -> Enqueued:
    """Queue a job; the same caller key twice with the same payload returns the first job,
    with another payload is a CallerKeyConflict."""
    existing = session.scalar(select(Job).where(Job.caller_key == request.caller_key))
    if existing is not None:
        return _repeat(existing, request, settings)

    sites = list(request.required_sites)
    if request.net is not None:
        try:
            net_config = settings.net(request.net)
        except KeyError:
            known = ", ".join(n.name for n in settings.nets) or "none"
            raise InvalidRequest(f"unknown net {request.net!r} (known: {known})") from None
        sites = sites or list(net_config.required_sites)
        lacking = net_config.lacks(sites)
        if lacking:
            assert net_config.sites is not None  # lacks() finds nothing otherwise
            raise InvalidRequest(
                f"required sites {lacking} are not on net {net_config.name}: "
                f"{net_config.name} has {', '.join(net_config.sites)}"
            )
    if not sites:
        raise InvalidRequest("required_sites is empty and no net default applies")
    if not settings.nets:
        raise InvalidRequest("no nets are configured, so no job can run")
    if request.net is None and all(n.lacks(sites) for n in settings.nets):
        # Every net declares its sites and none has them all: the job could never start.
        raise InvalidRequest(
            f"no net has every site in {sites}; "
            + "; ".join(f"{n.name} has {', '.join(n.sites or ())}" for n in settings.nets)
        )
    definition = resolve_definition(settings, request.definition)

    job = Job.new(
        caller_key=request.caller_key,
        definition=definition,
        required_sites=sites,
        requested_net=request.net,
        priority=request.priority,
        max_attempts=request.max_attempts or settings.max_attempts,
        now=now,
        job_id=job_id_for(request.caller_key),
        metadata=request.metadata,
        request_digest=_as_stored(request, settings).digest(),
    )
    try:
        # A savepoint, so losing a race on the caller key leaves the outer transaction usable.
        with session.begin_nested():
            session.add(job)
    except IntegrityError:
        # Not mutated: only a concurrent enqueue of the same key gets here (the integration
        # tier's test_enqueue_same_caller_key_twice_concurrently_returns_one_job pins it).
        winner = session.scalar(  # pragma: no mutate
            select(Job).where(Job.caller_key == request.caller_key)  # pragma: no mutate
        )
        if winner is None:  # pragma: no mutate (the race path, as above)
            raise
        return _repeat(winner, request, settings)  # pragma: no mutate
    log.info("job enqueued", extra={"job": str(job.id), "caller_key": request.caller_key})
    return Enqueued(job.id, created=True, state=job.state)


def _as_stored(request: EnqueueJob, settings: Settings) -> EnqueueJob:
    """The request with the defaults the job is stored with filled in (MAX_ATTEMPTS, the
    net's default sites), so that spelling a default out is the same request as omitting it."""
    sites = list(request.required_sites)
    if not sites and request.net is not None and settings.has_net(request.net):
        sites = list(settings.net(request.net).required_sites)
    return request.model_copy(
        update={
            "max_attempts": request.max_attempts or settings.max_attempts,
            "required_sites": sites,
        }
    )


def _repeat(existing: Job, request: EnqueueJob, settings: Settings) -> Enqueued:
    """A repeat of an enqueue: the same request (a retry) names the existing job; another
    payload under the same key is refused, since answering with the first job would let the
    caller believe its new request was queued."""
    digest = _as_stored(request, settings).digest()
    if existing.request_digest is not None and existing.request_digest != digest:
        raise CallerKeyConflict(
            f"caller_key {request.caller_key!r} already names job {existing.id} "
            f"({existing.state.value}), enqueued with a different payload"
            f"{_differences(existing, request)}; a new job needs a new caller_key"
        )
    return Enqueued(existing.id, created=False, state=existing.state)


def _differences(job: Job, request: EnqueueJob) -> str:
    """The fields that visibly differ, for the message (the digest decides)."""
    differ = [
        name
        for name, sent, kept in (
            ("net", request.net, job.requested_net),
            ("priority", request.priority, job.priority),
            ("metadata", request.metadata, job.metadata_),
        )
        if sent != kept
    ]
    if request.required_sites and sorted(request.required_sites) != sorted(job.required_sites):
        differ.append("required_sites")
    if request.max_attempts is not None and request.max_attempts != job.max_attempts:
        differ.append("max_attempts")
    return f" (differs in: {', '.join(differ)})" if differ else ""


def get_job_by_key(session: Session, caller_key: str) -> Job:
    """The job a caller_key names; NotFound if none."""
    job = session.scalar(select(Job).where(Job.caller_key == caller_key))
    if job is None:
        raise NotFound(f"no job with caller_key {caller_key!r}")
    return job


def _active_job_on(net_name_column: object) -> object:
    return exists().where(and_(Job.net_name == net_name_column, Job.state.in_(ACTIVE_JOB_STATES)))


def _claimable() -> ColumnElement[bool]:
    """A QUEUED job that may be claimed: one whose earlier run may still be alive (a stray
    run) waits, so a job never has two live runs."""
    return and_(Job.state == JobState.QUEUED, ~exists().where(StrayRun.job_id == Job.id))


def wanted_by_queued_job(net_name_column: Any) -> ColumnElement[bool]:
    """SQL: a claimable QUEUED job could run on this net (an unpinned job fits every net, a
    pinned one only its own)."""
    queued = _claimable()
    # Not mutated: without these conditions more nets are wanted than a QUEUED job wants
    # (the claim's job query finds none for them and moves on, the awaited poll watches a
    # run it need not), never fewer.
    pinned = select(Job.requested_net).where(  # pragma: no mutate
        queued,  # pragma: no mutate
        Job.requested_net.is_not(None),  # pragma: no mutate
    )
    return or_(exists().where(queued, Job.requested_net.is_(None)), net_name_column.in_(pinned))


def assign_next_job(session: Session, settings: Settings, now: datetime) -> Assignment | None:
    """Claim the next QUEUED job (priority, then age) and a free net for it.

    Both rows are taken with FOR UPDATE SKIP LOCKED (PostgreSQL), so concurrent claimers
    never block each other and never get the same job or net; on SQLite the transaction
    holds the write lock from BEGIN (see app.db). A warm (READY) net is preferred to a cold
    one. Serialised with `scale_down_idle_nets`, which locks the same net row.

    The first statement lists only the free nets some QUEUED job could run on (an unpinned
    job fits every free net; a pinned one only its own), so a claim that cannot place any
    job returns after that one query, whatever the number of nets or jobs.
    """
    if not settings.nets:
        return None
    warm_first = case(
        (Net.state == NetState.READY, 0),
        (Net.state == NetState.STARTING, 1),
        else_=2,  # pragma: no mutate (any rank after 1 orders the same)
    )
    free = (
        Net.state.in_(ASSIGNABLE_NET_STATES),
        ~_active_job_on(Net.name),  # type: ignore[operator]
        # A run the server may still hold must be settled before the net takes a new job.
        ~exists().where(StrayRun.net_name == Net.name),
    )
    queued = _claimable()
    candidates = session.scalars(
        select(Net.name)
        .where(*free, wanted_by_queued_job(Net.name))
        .order_by(warm_first, Net.name)  # pragma: no mutate (the name: a tie-break)
    ).all()
    for name in candidates:
        if not settings.has_net(name):
            continue  # a row left by a net no longer declared
        # Lock one net at a time: locking every free net in one statement would let the
        # first claimer hide all nets from the others until it commits.
        net = session.scalar(
            select(Net).where(Net.name == name, *free).with_for_update(skip_locked=True)
        )
        # Not mutated, nor the `continue` for a job below: only a concurrent claimer makes
        # either None, which SQLite's write lock from BEGIN rules out (PostgreSQL race tests).
        if net is None:
            continue  # pragma: no mutate
        job = _next_job_for(session, settings.net(name), queued)
        if job is None:
            continue  # pragma: no mutate (see above)
        job.assign(net.name, now)
        if net.state == NetState.STOPPED:
            net.transition(NetState.STARTING, now, f"job {job.id} assigned")
        net.idle_since = None
        session.flush()
        log.info("job assigned", extra={"job": str(job.id), "net": net.name})
        return Assignment(job.id, net.name, net.state, job.attempts)
    return None


# How many of a net's next QUEUED jobs a claim looks through for one whose sites the net
# declares it has (a net that declares none takes the first).
SITES_SCAN = 50


def _next_job_for(session: Session, net: NetConfig, queued: ColumnElement[bool]) -> Job | None:
    """The next QUEUED job (priority, then age) that may run on `net`, locked."""
    stmt = (
        select(Job)
        .where(queued, or_(Job.requested_net.is_(None), Job.requested_net == net.name))
        .order_by(
            Job.priority.desc(),
            Job.created_at,
            Job.id,  # pragma: no mutate (a tie-break)
        )
        .with_for_update(skip_locked=True)
    )
    if net.sites is None:
        # (a bound only: scalar() reads the first row anyway)
        return session.scalar(stmt.limit(1))  # pragma: no mutate
    # A net that declares its sites never takes a job needing one it lacks: enqueue refused
    # such a job only when no net could run it, so another net may.
    return next(
        (
            job
            for job in session.scalars(stmt.limit(SITES_SCAN))
            if not net.lacks(job.required_sites)
        ),
        None,
    )


def queued_job_fits(session: Session, settings: Settings, net_name: str) -> bool:
    """A QUEUED job that could be claimed onto this net waits (claimable, pinned to it or
    unpinned, and with sites the net has where it declares them)."""
    net = settings.net(net_name)
    sites = select(Job.required_sites).where(
        _claimable(), or_(Job.requested_net.is_(None), Job.requested_net == net_name)
    )
    if net.sites is None:
        return bool(session.scalar(select(exists(sites))))
    return any(not net.lacks(required) for required in session.scalars(sites))


def get_job(
    session: Session,
    job_id: uuid.UUID,
    *,
    lock: bool = False,  # pragma: no mutate (a lock: no-op on SQLite)
) -> Job:
    """The job with this id, optionally locked for update; NotFound otherwise."""
    stmt = select(Job).where(Job.id == job_id)
    if lock:
        stmt = stmt.with_for_update()
    job = session.scalar(stmt)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def get_net(
    session: Session,
    name: str,
    *,
    lock: bool = False,  # pragma: no mutate (a lock: no-op on SQLite)
) -> Net:
    """The net with this name, optionally locked for update; NotFound otherwise."""
    stmt = select(Net).where(Net.name == name)
    if lock:
        stmt = stmt.with_for_update()
    net = session.scalar(stmt)
    if net is None:
        raise NotFound(f"net {name} not found")  # pragma: no mutate (callers name declared nets)
    return net


def release_net(session: Session, net_name: str, now: datetime) -> None:
    """A net's job is over: BUSY -> READY with the idle grace starting now.

    A net still STARTING stays so (the next job may take it, or reconcile settles it); a
    net in any other state keeps it, since the state already says what is wrong.
    """
    net = get_net(session, net_name, lock=True)
    # Not mutated: a guard only; a net holds one active job at most and every caller has just
    # ended (or requeued) it, so no test can see the guard fail.
    if active_job(session, net_name) is not None:  # pragma: no mutate
        return
    if net.state in (NetState.BUSY, NetState.READY):
        net.mark_idle(now)


def requeue_job(
    session: Session,
    job_id: uuid.UUID,
    reason: str,
    now: datetime,
    *,
    count_attempt: bool = True,
) -> bool:
    """Give the job back to the queue (attempts + 1) and free its net; FAILED past
    max_attempts. Returns True if requeued. A job that is no longer active is left alone."""
    job = get_job(session, job_id, lock=True)
    if job.state not in (JobState.ASSIGNED, JobState.DISPATCHING, JobState.RUNNING):
        return False
    net_name = job.net_name
    requeued = job.requeue(reason, now, count_attempt=count_attempt)
    session.flush()
    if net_name is not None:
        release_net(session, net_name, now)
    log.warning(
        "job requeued" if requeued else "job failed: attempts exhausted",
        extra={"job": str(job_id), "net": net_name, "reason": reason},
    )
    return requeued


def add_stray_run(
    session: Session,
    *,
    net_name: str,
    job_id: uuid.UUID,
    nvflare_job_id: str | None,
    submit_token: str | None,
    reason: str,
    now: datetime,
) -> None:
    """Record a run the net's server may hold that no job counts (see models.StrayRun).
    A run already recorded (the same job's run on the same net, known by its id or its
    token) stays one stray, completed with what this call knows: every live run is counted
    once."""
    for known in session.scalars(
        select(StrayRun).where(StrayRun.net_name == net_name, StrayRun.job_id == job_id)
    ):
        same_id = nvflare_job_id is not None and known.nvflare_job_id == nvflare_job_id
        same_token = submit_token is not None and known.submit_token == submit_token
        if same_id or same_token:
            known.nvflare_job_id = known.nvflare_job_id or nvflare_job_id
            known.submit_token = known.submit_token or submit_token
            return
    session.add(
        StrayRun(
            net_name=net_name,
            job_id=job_id,
            nvflare_job_id=nvflare_job_id,
            submit_token=submit_token,
            reason=reason,
            created_at=now,
        )
    )
    log.warning(
        "stray run recorded",
        extra={"net": net_name, "job": str(job_id), "nvflare_job_id": nvflare_job_id},
    )


def clear_stray_runs(session: Session, net_name: str) -> int:
    """The net's server is gone (confirmed at 0 replicas): its stray runs died with it."""
    strays = list(session.scalars(select(StrayRun).where(StrayRun.net_name == net_name)))
    for stray in strays:
        session.delete(stray)
    return len(strays)


def active_job(session: Session, net_name: str) -> Job | None:
    """The net's active job, if any (at most one: the database enforces it)."""
    return session.scalar(
        select(Job).where(Job.net_name == net_name, Job.state.in_(ACTIVE_JOB_STATES))
    )


def mark_dispatched(
    session: Session,
    job_id: uuid.UUID,
    nvflare_job_id: str,
    server_start_time: float | None,
    now: datetime,
) -> None:
    """The server accepted the job: job RUNNING, net BUSY, the server's start time noted."""
    job = get_job(session, job_id, lock=True)
    # Not mutated: both callers pass a job they found DISPATCHING under the same lock, for
    # which `or` reads the same; this only guards a caller that does not.
    if job.state == JobState.RUNNING and job.nvflare_job_id == nvflare_job_id:  # pragma: no mutate
        return  # a repeated delivery
    job.mark_running(nvflare_job_id, now)
    assert job.net_name is not None
    net = get_net(session, job.net_name, lock=True)
    net.transition(NetState.BUSY, now, f"job {job.id} running")
    if server_start_time is not None:
        # Never overwrite the start time readiness stored with "unknown": restart detection
        # would switch itself off for the whole run.
        net.server_start_time = server_start_time
    net.unreachable_since = None


def finish_job(
    session: Session,
    job_id: uuid.UUID,
    outcome: JobState,
    reason: str,
    now: datetime,
    *,
    code: ReasonCode,
) -> bool:
    """Move an active job to a terminal state, `code` saying why (models.reasons), and free
    its net. Returns False if the job was already terminal (a repeated signal is not an
    error)."""
    if outcome not in TERMINAL_JOB_STATES:
        raise ValueError(f"{outcome} is not a terminal state")  # pragma: no mutate (a bug's text)
    job = get_job(session, job_id, lock=True)
    if job.state in TERMINAL_JOB_STATES:
        return False
    if outcome == JobState.FAILED:
        job.fail(reason, now, code)
    else:
        job.transition(outcome, now, reason, code=code)
    session.flush()
    if job.net_name is not None:
        release_net(session, job.net_name, now)
    log.info(
        "job finished",
        extra={"job": str(job_id), "state": str(outcome), "reason": reason, "code": str(code)},
    )
    return True


@dataclass(frozen=True)
class AbortDecision:
    """What an abort request did in SQL, and whether the server must be asked too."""

    job_id: uuid.UUID
    state: JobState
    needs_server_abort: bool


def abort_job(
    session: Session,
    job_id: uuid.UUID,
    reason: str,
    now: datetime,
    code: ReasonCode = ReasonCode.ABORTED,
) -> AbortDecision:
    """Abort as far as SQL can: QUEUED, ASSIGNED or FINISHING (the run is over) -> ABORTED at
    once (net released); DISPATCHING or RUNNING -> ABORTING (the server must be told);
    terminal -> unchanged."""
    job = get_job(session, job_id, lock=True)
    if job.state in (JobState.QUEUED, JobState.ASSIGNED, JobState.FINISHING):
        net_name = job.net_name
        job.transition(JobState.ABORTED, now, reason, code=code)
        session.flush()
        if net_name is not None:
            release_net(session, net_name, now)
        return AbortDecision(job.id, job.state, needs_server_abort=False)
    if job.state in (JobState.DISPATCHING, JobState.RUNNING):
        job.transition(JobState.ABORTING, now, reason)
        return AbortDecision(job.id, job.state, needs_server_abort=True)
    return AbortDecision(job.id, job.state, needs_server_abort=job.state == JobState.ABORTING)


_REPORTED_OUTCOME = {
    ReportedStatus.RESULTS_UPLOADED: (JobState.COMPLETED, ReasonCode.RESULTS_UPLOADED),
    ReportedStatus.RESULTS_UPLOAD_FAILED: (JobState.FAILED, ReasonCode.RESULTS_UPLOAD_FAILED),
    ReportedStatus.ERROR: (JobState.FAILED, ReasonCode.REPORTED_ERROR),
    ReportedStatus.STOPPED: (JobState.ABORTED, ReasonCode.REPORTED_STOPPED),
}


REPORT_TIMEOUT_REASON = "no results report from flip-api"


def hold_for_report(session: Session, job_id: uuid.UUID, detail: str, now: datetime) -> None:
    """NVFLARE finished the run; its results are still on the server's disk: FINISHING keeps
    the net BUSY (never scaled down) until flip-api reports the upload or time runs out."""
    job = get_job(session, job_id, lock=True)
    job.transition(JobState.FINISHING, now, f"{detail}; holding the server for results upload")


def expire_report_wait(
    session: Session, job_id: uuid.UUID, outcome: JobState, waited_s: float, now: datetime
) -> bool:
    """flip-api never reported the upload of a FINISHING job: settle it with `outcome`."""
    job = get_job(session, job_id, lock=True)
    if job.state != JobState.FINISHING:
        return False
    reason = f"{REPORT_TIMEOUT_REASON} within {waited_s:.0f}s"
    log.warning("report timeout", extra={"job": str(job_id), "outcome": str(outcome)})
    return finish_job(session, job_id, outcome, reason, now, code=ReasonCode.REPORT_TIMEOUT)


CALLER_KEY_CHARS = 200  # rejected_requests.caller_key, as jobs.caller_key


def record_rejection(
    session: Session,
    caller_key: str | None,
    reason: str,
    now: datetime,
    retention_s: float,
    *,
    callbacks: bool = False,  # pragma: no mutate (its one caller always passes it)
    code: ReasonCode = ReasonCode.REJECTED,
) -> RejectedRequest:
    """Keep a refused enqueue for a while (so `GET /jobs/{id}` can say "rejected") and drop
    rejections older than the retention. `callbacks` (CALLBACK_URL is set): the row is also
    the `rejected` event to deliver, so one not yet delivered (or given up) is kept past the
    retention until it is."""
    # A key that cannot be stored (NUL, a lone surrogate) is kept escaped, so the refusal
    # itself is never lost; no job could ever have had such a key, hence no job id.
    valid_key = caller_key is not None and unstorable(caller_key) is None
    rejection = RejectedRequest(
        job_id=job_id_for(caller_key) if caller_key and valid_key else None,
        caller_key=storable(caller_key)[:CALLER_KEY_CHARS] if caller_key is not None else None,
        reason=storable(reason)[:4000],
        reason_code=code,
        at=now,
    )
    session.add(rejection)
    expired = RejectedRequest.at < now - timedelta(seconds=retention_s)
    if callbacks:
        expired = and_(expired, RejectedRequest.callback_settled_at.is_not(None))
    session.execute(delete(RejectedRequest).where(expired))
    return rejection


def get_rejection(session: Session, job_id: uuid.UUID) -> RejectedRequest | None:
    """The latest rejection of an enqueue that would have created this job, if any."""
    return session.scalar(
        select(RejectedRequest)
        .where(RejectedRequest.job_id == job_id)
        .order_by(RejectedRequest.at.desc(), RejectedRequest.id.desc())
        .limit(1)  # pragma: no mutate (a bound only: scalar() reads the first row anyway)
    )


def report_job_status(session: Session, report: ReportJobStatus, now: datetime) -> JobState:
    """flip-api's terminal-status signal; a job already terminal keeps its state, a
    DISPATCHING one goes ABORTING (its caller sends the server abort), and a RUNNING one's run
    is kept as a stray run until its server says it is over (its caller settles it)."""
    job = get_job(session, report.job_id)
    if job.state not in TERMINAL_JOB_STATES:
        # A submit in flight: DISPATCHING, or ABORTING before its run was recorded.
        in_flight = job.state == JobState.DISPATCHING or (
            job.state == JobState.ABORTING and job.nvflare_job_id is None
        )
        not_run_yet = job.state in (JobState.QUEUED, JobState.ASSIGNED) or in_flight
        if not_run_yet and report.status != ReportedStatus.STOPPED:
            raise InvalidRequest(f"job {job.id} has not run yet; only 'stopped' applies to it")
        reason = f"flip-api reported {report.status.value}"
        if report.detail:
            reason += f": {report.detail}"
        if in_flight:
            # Its submit may land yet: stopped like an abort (ABORTING until the server was
            # told, which dispatch does once the run lands, within ABORT_TIMEOUT_S at most),
            # so the net is not handed to the next job while this one's run may still land.
            return abort_job(session, job.id, reason, now, ReasonCode.REPORTED_STOPPED).state
        if job.state in (JobState.RUNNING, JobState.ABORTING) and job.net_name is not None:
            # NVFLARE has not said the run is over (an ABORTING job's abort may not have
            # reached its server yet): until its server does, the run counts for nobody and
            # must not have the next job beside it.
            add_stray_run(
                session,
                net_name=job.net_name,
                job_id=job.id,
                nvflare_job_id=job.nvflare_job_id,
                submit_token=job.submit_token,
                reason=reason,
                now=now,
            )
        outcome, code = _REPORTED_OUTCOME[report.status]
        finish_job(session, job.id, outcome, reason, now, code=code)
    return job.state

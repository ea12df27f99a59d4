"""The SQL moves on jobs and nets that the use cases share: rows read and locked, a job
finished, requeued, aborted or reported on, its net released, and stray runs recorded.
Storing an enqueue is `enqueue`'s; claiming a job for a net is `claims`'; the nets' rows
kept in step with what NETS declares are `declared_nets`'.

Each takes an open `Session` (the caller's unit of work commits or rolls back) and an
explicit `now`, and never talks to NVFLARE or a cloud API: those calls live in
`app.usecases.dispatch`, which uses these functions for every state change. Tasks, the CLI, the HTTP
API and the tests all call these same functions.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from app.errors import InvalidRequest, NotFound
from app.schemas import ReportedStatus, ReportJobStatus, require_storable
from app.settings import Settings
from app.usecases import rows
from models import (
    ACTIVE_JOB_STATES,
    TERMINAL_JOB_STATES,
    Job,
    JobEvent,
    JobState,
    Net,
    NetState,
    ReasonCode,
    StrayRun,
)

log = logging.getLogger(__name__)


def job_folder(settings: Settings, definition: str) -> Path:
    """The local folder of a stored (already validated) definition."""
    return (settings.job_root / definition).resolve()


# The hottest reads, built once at import rather than per call (issue 37).
_JOB = select(Job).where(Job.id == bindparam("key"))
_JOB_LOCKED = _JOB.with_for_update()
_NET = select(Net).where(Net.name == bindparam("key"))
_NET_LOCKED = _NET.with_for_update()


def get_job(
    session: Session,
    job_id: uuid.UUID,
    *,
    lock: bool = False,
) -> Job:
    """The job with this id, optionally locked for update; NotFound otherwise. A job this
    transaction already locked is not read again (`rows`)."""
    job = rows.held(session, Job, job_id)
    if job is not None:
        return job
    job = session.scalar(_JOB_LOCKED if lock else _JOB, {"key": job_id})
    if job is None:
        raise NotFound(f"job {job_id} not found")
    if lock:
        rows.note_locked(session, job, job_id)
    return job


def get_net(
    session: Session,
    name: str,
    *,
    lock: bool = False,
) -> Net:
    """The net with this name, optionally locked for update; NotFound otherwise. A net this
    transaction already locked is not read again (`rows`)."""
    net = rows.held(session, Net, name)
    if net is not None:
        return net
    net = session.scalar(_NET_LOCKED if lock else _NET, {"key": name})
    if net is None:
        raise NotFound(f"net {name} not found")
    if lock:
        rows.note_locked(session, net, name)
    return net


def release_net(session: Session, net_name: str, now: datetime) -> None:
    """A net's job is over: BUSY -> READY with the idle grace starting now.

    A net still STARTING stays so (the next job may take it, or reconcile settles it); a
    net in any other state keeps it, since the state already says what is wrong. A net a
    worker start found misconfigured under this job goes MISCONFIGURED instead, in the
    same transaction, so no claim takes it (reconcile then scales it down).
    """
    net = get_net(session, net_name, lock=True)
    # Every caller has just ended (or requeued) the net's one active job; a net still held
    # is left as it is (test_a_net_is_not_released_while_a_job_still_holds_it).
    if active_job(session, net_name) is not None:
        return
    verdict = net.misconfigured_after_job
    if verdict is not None:
        net.misconfigured_after_job = None
        if net.state != NetState.MISCONFIGURED:
            net.transition(NetState.MISCONFIGURED, now, verdict)
            net.last_error = verdict
        return
    if net.state in (NetState.BUSY, NetState.READY):
        net.mark_idle(now)


def dispatches_of(session: Session, job_id: uuid.UUID) -> list[int | None]:
    """The attempt of each time the job went DISPATCHING (its history): each dispatch's
    submit token must be new, even when a requeue counted no attempt. In no set order:
    `Job.start_dispatch` asks only whether an attempt is among them and how many there are."""
    return list(
        session.scalars(
            select(JobEvent.attempt).where(
                JobEvent.job_id == job_id, JobEvent.to_state == JobState.DISPATCHING
            )
        )
    )


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
    settle_after: datetime | None = None,
) -> None:
    """Record a run the net's server may hold that no job counts (see models.StrayRun).
    A run already recorded (the same job's run on the same net, known by its id or its
    token) stays one stray, completed with what this call knows: every live run is counted
    once. `settle_after`: not settled before then (the later of two such times holds)."""
    for known in session.scalars(
        select(StrayRun).where(StrayRun.net_name == net_name, StrayRun.job_id == job_id)
    ):
        same_id = nvflare_job_id is not None and known.nvflare_job_id == nvflare_job_id
        same_token = submit_token is not None and known.submit_token == submit_token
        if same_id or same_token:
            known.nvflare_job_id = known.nvflare_job_id or nvflare_job_id
            known.submit_token = known.submit_token or submit_token
            known.settle_after = later(known.settle_after, settle_after)
            return
    session.add(
        StrayRun(
            net_name=net_name,
            job_id=job_id,
            nvflare_job_id=nvflare_job_id,
            submit_token=submit_token,
            reason=reason,
            created_at=now,
            settle_after=settle_after,
        )
    )
    log.warning(
        "stray run recorded",
        extra={"net": net_name, "job": str(job_id), "nvflare_job_id": nvflare_job_id},
    )


def later(a: datetime | None, b: datetime | None) -> datetime | None:
    """The later of two optional times (None: no time)."""
    if a is None or b is None:
        return a or b
    return max(a, b)


def clear_stray_runs(session: Session, net_name: str, *, runs_revive: bool = False) -> int:
    """The net's server is gone (confirmed at 0 replicas): its stray runs died with it;
    none on a net whose pending runs revive (`runs_revive`: a run pending in the server's
    state database starts again with its next server, so its stray is kept until a server
    that answers settles it). Returns how many were forgotten."""
    if runs_revive:
        return 0
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
    # Both callers pass a job they found DISPATCHING under the same lock; a RUNNING job
    # told of another run is an illegal move, never taken for a repeat.
    if job.state == JobState.RUNNING and job.nvflare_job_id == nvflare_job_id:
        return  # a repeated delivery
    job.mark_running(nvflare_job_id, now)
    assert job.net_name is not None
    net = get_net(session, job.net_name, lock=True)
    net.transition(NetState.BUSY, now, f"job {job.id} running")
    if server_start_time is not None:
        # Never overwrite the start time readiness stored with "unknown": restart detection
        # would switch itself off for the whole run.
        net.server_start_time = server_start_time
    net.answered()


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
        raise ValueError(f"{outcome} is not a terminal state")
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
    require_storable(reason, "reason")  # every door's reason goes into the history
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


def reported_reason(report: ReportJobStatus) -> str:
    """The history's words for flip-api's report (an early abort's too: `early_aborts`)."""
    reason = f"flip-api reported {report.status.value}"
    return f"{reason}: {report.detail}" if report.detail else reason


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
        reason = reported_reason(report)
        if in_flight:
            # Its submit may land yet: stopped like an abort (ABORTING until the server was
            # told, which dispatch does once the run lands, within ABORT_TIMEOUT_S at most),
            # so the net is not handed to the next job while this one's run may still land.
            # No code here: abort_job moves such a job to ABORTING, which takes none; its end
            # carries the abort's (app.usecases.abort: `aborted`, `abort_unconfirmed`...).
            return abort_job(session, job.id, reason, now).state
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

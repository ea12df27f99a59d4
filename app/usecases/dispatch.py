"""Use cases that talk to the outside world: scale, wait until ready, dispatch, abort,
and the housekeeping that beat drives.

Every function here is idempotent: it re-reads the rows it acts on, does nothing if the
work is done, and keeps calls to a driver or an NVFLARE server OUTSIDE any transaction
that holds a row lock (a slow server must never block the queue). Follow-up tasks go out
through `rt.outbox` only after the transaction that made them necessary has committed.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session

from app.adapters.jobdefs import materialize
from app.adapters.nvflare.base import AbortOutcome, Readiness, ServerState
from app.db import unit_of_work
from app.errors import (
    DispatcherError,
    InvalidRequest,
    JobOutcomeError,
    MisconfigurationError,
    ServerUnavailable,
    TransientError,
)
from app.runtime import Runtime
from app.usecases import services
from models import ACTIVE_JOB_STATES, Job, JobState, Net, NetState, ScaleEvent

log = logging.getLogger(__name__)

ASSIGN_NEXT_JOB = "fl_dispatcher.assign_next_job"
ABORT_ON_SERVER = "fl_dispatcher.abort_on_server"
DISPATCH = "fl_dispatcher.dispatch"

# NVFLARE 2.9.0 RunStatus (nvflare/apis/job_def.py) -> our terminal state. Statuses not
# listed (SUBMITTED, APPROVED, DISPATCHED, RUNNING) mean "still going": a SUBMITTED job
# waits for its sites and still occupies the server.
NVFLARE_OUTCOMES: dict[str, JobState] = {
    "FINISHED:COMPLETED": JobState.COMPLETED,
    "FINISHED:ABORTED": JobState.ABORTED,
    "FINISHED:EXECUTION_EXCEPTION": JobState.FAILED,
    "FINISHED:FAILED_TO_RUN": JobState.FAILED,
    "FINISHED:CAN_NOT_SCHEDULE": JobState.FAILED,
}
# The run ended without a verdict: decided by LOST_JOB_POLICY like a lost server.
NVFLARE_LOST = frozenset({"FINISHED:ABNORMAL", "FINISHED:ABANDONED"})


class Step(StrEnum):
    """What a pipeline step did."""

    DONE = "done"
    SKIPPED = "skipped"  # the job moved on (aborted, requeued, already done): nothing to do
    NOT_READY = "not_ready"  # poll again
    GAVE_UP = "gave_up"  # past the deadline: job requeued, net marked


@dataclass(frozen=True)
class StepResult:
    """A step's outcome with a reason for the log and the test."""

    step: Step
    detail: str = ""


def _record_scale(
    session: Session,
    *,
    net: str,
    action: str,
    replicas: int,
    reason: str,
    outcome: str,
    now: datetime,
) -> None:
    session.add(
        ScaleEvent(
            net_name=net,
            action=action,
            replicas=replicas,
            reason=reason,
            outcome=outcome[:200],
            at=now,
        )
    )
    log.info(
        "scale decision",
        extra={
            "net": net,
            "action": action,
            "replicas": replicas,
            "reason": reason,
            "outcome": outcome,
        },
    )


def _scale(rt: Runtime, net: str, replicas: int, reason: str) -> None:
    """Ask the driver for `replicas`, recording the decision and its outcome either way."""
    outcome = "error: unexpected failure (see the worker log)"
    try:
        rt.driver(net).scale(replicas)
        outcome = "ok"
    except DispatcherError as exc:
        kind = "misconfigured" if isinstance(exc, MisconfigurationError) else "error"
        outcome = f"{kind}: {exc}"
        raise
    finally:
        with unit_of_work(rt.sessions) as session:
            _record_scale(
                session,
                net=net,
                action="scale_up" if replicas else "scale_down",
                replicas=replicas,
                reason=reason,
                outcome=outcome,
                now=rt.clock(),
            )


def _kick(rt: Runtime) -> None:
    rt.outbox.send(ASSIGN_NEXT_JOB)


# --- the dispatch pipeline -------------------------------------------------------------


def assign_jobs(rt: Runtime, limit: int = 50) -> list[services.Assignment]:
    """Claim QUEUED jobs onto free nets, one transaction per claim, and start a pipeline
    for each after its claim has committed."""
    claimed = []
    for _ in range(limit):
        with unit_of_work(rt.sessions) as session:
            assignment = services.assign_next_job(session, rt.settings, rt.clock())
        if assignment is None:
            break
        rt.outbox.start_pipeline(str(assignment.job_id), assignment.net_name)
        claimed.append(assignment)
    return claimed


def _assigned(session: Session, job_id: uuid.UUID, net_name: str) -> Job | None:
    job = services.get_job(session, job_id)
    if job.state != JobState.ASSIGNED or job.net_name != net_name:
        return None
    return job


def scale_up(rt: Runtime, job_id: uuid.UUID, net_name: str) -> StepResult:
    """Step 1: the net's driver asked for one replica (no-op for a warm or always-on net)."""
    with unit_of_work(rt.sessions) as session:
        job = _assigned(session, job_id, net_name)
        if job is None:
            return StepResult(Step.SKIPPED, "job no longer assigned to this net")
        net_state = services.get_net(session, net_name).state
    if rt.settings.is_always_on(rt.settings.net(net_name)):
        return StepResult(Step.DONE, "always-on net: never scaled")
    if net_state in (NetState.READY, NetState.BUSY) and rt.driver(net_name).observe().is_up:
        # A warm net is reused as is; but one whose server died unnoticed is scaled again.
        return StepResult(Step.DONE, "server already up")
    try:
        _scale(rt, net_name, 1, f"job {job_id} assigned")
    except MisconfigurationError as exc:
        _net_misconfigured(rt, net_name, job_id, str(exc))
        raise
    return StepResult(Step.DONE, "driver asked for 1 replica")


def _net_misconfigured(rt: Runtime, net_name: str, job_id: uuid.UUID | None, reason: str) -> None:
    """Fail loud: the net needs a human; its job goes back to the queue (not lost)."""
    log.error("net misconfigured", extra={"net": net_name, "job": str(job_id), "reason": reason})
    with unit_of_work(rt.sessions) as session:
        if job_id is not None:
            services.requeue_job(
                session, job_id, f"net {net_name} misconfigured: {reason}", rt.clock()
            )
        net = services.get_net(session, net_name, lock=True)
        net.transition(NetState.MISCONFIGURED, rt.clock(), reason)
        net.last_error = reason
    if not rt.settings.is_always_on(rt.settings.net(net_name)):
        try:
            _scale(rt, net_name, 0, "net misconfigured")
        except DispatcherError:
            log.exception("scale-down of a misconfigured net failed", extra={"net": net_name})
    _kick(rt)


def check_ready(rt: Runtime, job_id: uuid.UUID, net_name: str) -> StepResult:
    """Step 2: is the net ready for this job? Driver running, a FRESH admin login, server
    answering, every required site connected. Past the readiness deadline: give up."""
    now = rt.clock()
    net_config = rt.settings.net(net_name)
    always_on = rt.settings.is_always_on(net_config)
    with unit_of_work(rt.sessions) as session:
        job = _assigned(session, job_id, net_name)
        if job is None:
            return StepResult(Step.SKIPPED, "job no longer assigned to this net")
        required = list(job.required_sites)
        assigned_at = job.assigned_at or now

    readiness: Readiness | None = None
    detail = ""
    try:
        observation = None if always_on else rt.driver(net_name).observe()
        if observation is not None and observation.failure:
            return _give_up_readiness(rt, job_id, net_name, f"driver: {observation.failure}")
        if observation is not None and not observation.is_up:
            detail = (
                f"driver: desired={observation.desired} running={observation.running} "
                f"pending={observation.pending}"
            )
        else:
            readiness = rt.admin(net_name).is_ready(required)
            detail = readiness.detail or f"missing sites {list(readiness.missing_sites)}"
    except MisconfigurationError as exc:  # wrong kit or CA, missing service: never "down"
        _net_misconfigured(rt, net_name, job_id, str(exc))
        raise
    except TransientError as exc:
        detail = f"transient: {exc}"

    if readiness is not None and readiness.ready:
        with unit_of_work(rt.sessions) as session:
            net = services.get_net(session, net_name, lock=True)
            if net.state != NetState.READY:
                net.transition(NetState.READY, rt.clock(), f"ready for job {job_id}")
            net.server_start_time = readiness.server_start_time
            net.unreachable_since = None
        return StepResult(Step.DONE, "ready")

    if (now - assigned_at).total_seconds() > net_config.ready_timeout_s:
        return _give_up_readiness(
            rt, job_id, net_name, f"not ready after {net_config.ready_timeout_s:.0f}s: {detail}"
        )
    return StepResult(Step.NOT_READY, detail)


def _give_up_readiness(rt: Runtime, job_id: uuid.UUID, net_name: str, reason: str) -> StepResult:
    """Requeue the job and mark the net: UNHEALTHY (scaled down) or, always-on, OUTAGE."""
    always_on = rt.settings.is_always_on(rt.settings.net(net_name))
    with unit_of_work(rt.sessions) as session:
        services.requeue_job(session, job_id, reason, rt.clock())
        net = services.get_net(session, net_name, lock=True)
        target = NetState.OUTAGE if always_on else NetState.UNHEALTHY
        if net.state != target:
            net.transition(target, rt.clock(), reason)
        net.last_error = reason
    log.error(
        "net not ready past its deadline",
        extra={"net": net_name, "job": str(job_id), "reason": reason},
    )
    if not always_on:
        try:
            _scale(rt, net_name, 0, "readiness deadline passed")
        except DispatcherError:
            log.exception("scale-down after readiness failure failed", extra={"net": net_name})
    _kick(rt)
    return StepResult(Step.GAVE_UP, reason)


def dispatch(rt: Runtime, job_id: uuid.UUID) -> StepResult:
    """Step 3: submit with the submit token stored FIRST, so a retry after an unknown
    outcome or a redelivered message finds the same NVFLARE job instead of a second run."""
    with unit_of_work(rt.sessions) as session:
        job = services.get_job(session, job_id, lock=True)
        if job.state == JobState.ASSIGNED:
            token = job.start_dispatch(rt.clock())
        elif job.state == JobState.DISPATCHING and job.submit_token:
            token = job.submit_token
        else:
            return StepResult(Step.SKIPPED, f"job is {job.state}")
        net_name = job.net_name
        definition = job.definition
    assert net_name is not None

    admin = rt.admin(net_name)
    try:
        folder = materialize(rt.settings, definition, job_id)
        nvflare_job_id = admin.submit(folder, token)  # TransientError -> the task retries
    except (InvalidRequest, JobOutcomeError) as exc:
        # The definition itself is bad: retrying cannot help, and the net is fine.
        with unit_of_work(rt.sessions) as session:
            services.finish_job(session, job_id, JobState.FAILED, f"rejected: {exc}", rt.clock())
        _kick(rt)
        return StepResult(Step.GAVE_UP, str(exc))
    except MisconfigurationError as exc:
        _net_misconfigured(rt, net_name, job_id, str(exc))
        raise
    try:
        start_time: float | None = admin.server_start_time()
    except TransientError:
        start_time = None  # monitor learns it on its next round

    abort_needed = False
    with unit_of_work(rt.sessions) as session:
        job = services.get_job(session, job_id, lock=True)
        if job.state == JobState.ABORTING:
            # Aborted while the submit was in flight: the run exists now, so stop it.
            job.nvflare_job_id = nvflare_job_id
            abort_needed = True
        elif job.state == JobState.DISPATCHING:
            services.mark_dispatched(session, job_id, nvflare_job_id, start_time, rt.clock())
        elif job.state == JobState.RUNNING:
            pass  # a repeated delivery already recorded it
        else:
            log.warning(
                "submitted a job that moved on meanwhile",
                extra={"job": str(job_id), "state": str(job.state)},
            )
    if abort_needed:
        rt.outbox.send(ABORT_ON_SERVER, job_id=str(job_id))
    log.info(
        "job dispatched",
        extra={"job": str(job_id), "net": net_name, "nvflare_job_id": nvflare_job_id},
    )
    return StepResult(Step.DONE, nvflare_job_id)


def requeue_after_transient(rt: Runtime, job_id: uuid.UUID, reason: str) -> bool:
    """A pipeline step ran out of retries on a transient error: requeue, never delete."""
    with unit_of_work(rt.sessions) as session:
        requeued = services.requeue_job(session, job_id, reason, rt.clock())
    _kick(rt)
    return requeued


def count_retry(rt: Runtime, job_id: uuid.UUID) -> None:
    """One more transient retry of this job's pipeline (a metric, not a state)."""
    with unit_of_work(rt.sessions) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is not None:
            job.retries += 1


# --- abort ------------------------------------------------------------------------------


def abort(rt: Runtime, job_id: uuid.UUID, reason: str) -> JobState:
    """flip-api's abort: SQL first; a server abort only if the job may be running there."""
    with unit_of_work(rt.sessions) as session:
        decision = services.abort_job(session, job_id, reason, rt.clock())
    if decision.needs_server_abort:
        return abort_on_server(rt, job_id)
    _kick(rt)
    return decision.state


def abort_on_server(rt: Runtime, job_id: uuid.UUID) -> JobState:
    """Abort an ABORTING job's run. A server that is down, or that does not know the job or
    has it not running, means "nothing to abort": ABORTED, net released, no error."""
    with unit_of_work(rt.sessions) as session:
        job = services.get_job(session, job_id)
        if job.state != JobState.ABORTING:
            return job.state
        nvflare_job_id, net_name = job.nvflare_job_id, job.net_name
    if nvflare_job_id is None or net_name is None:
        return JobState.ABORTING  # submit in flight: dispatch() sends the abort when it lands
    result = rt.admin(net_name).abort(nvflare_job_id)
    if result.outcome == AbortOutcome.ALREADY_FINISHED:
        return _settle_finished(rt, job_id, net_name, nvflare_job_id)
    reason = (
        "aborted on the server"
        if result.outcome == AbortOutcome.ABORTED
        else (f"nothing to abort: {result.detail or result.outcome}")
    )
    with unit_of_work(rt.sessions) as session:
        services.finish_job(session, job_id, JobState.ABORTED, reason, rt.clock())
    _kick(rt)
    return JobState.ABORTED


def _settle_finished(
    rt: Runtime, job_id: uuid.UUID, net_name: str, nvflare_job_id: str
) -> JobState:
    """The run had already finished when the abort came: record how it finished."""
    try:
        status = rt.admin(net_name).job_status(nvflare_job_id)
    except DispatcherError:
        status = ""
    outcome = NVFLARE_OUTCOMES.get(status, JobState.ABORTED)
    with unit_of_work(rt.sessions) as session:
        services.finish_job(
            session, job_id, outcome, f"finished before abort: {status}", rt.clock()
        )
    _kick(rt)
    return outcome


# --- housekeeping (beat) ----------------------------------------------------------------


def _scaling_nets(rt: Runtime) -> list[str]:
    return [n.name for n in rt.settings.nets if not rt.settings.is_always_on(n)]


def scale_down_idle_nets(rt: Runtime) -> list[str]:
    """READY nets with no active job and no QUEUED job that could run there, idle past their
    grace, go STOPPING -> driver 0 -> STOPPED. The net row is locked like assign_next_job
    locks it, so a job claimed at the same moment is never stranded on a vanishing server."""
    stopped = []
    now = rt.clock()
    for name in _scaling_nets(rt):
        idle_timeout_s = rt.settings.net(name).idle_timeout_s
        with unit_of_work(rt.sessions) as session:
            net = session.scalar(
                select(Net)
                .where(Net.name == name, Net.state == NetState.READY)
                .with_for_update(skip_locked=True)
            )
            if net is None:
                continue
            idle_since = net.idle_since or net.state_changed_at
            if (now - idle_since).total_seconds() < idle_timeout_s:
                continue
            busy = session.scalar(
                select(
                    exists().where(
                        or_(
                            (Job.net_name == name) & Job.state.in_(ACTIVE_JOB_STATES),
                            (Job.state == JobState.QUEUED)
                            & or_(Job.requested_net.is_(None), Job.requested_net == name),
                        )
                    )
                )
            )
            if busy:
                continue
            net.transition(
                NetState.STOPPING, now, f"idle for {(now - idle_since).total_seconds():.0f}s"
            )
        _stop_net(rt, name, "idle grace passed")
        stopped.append(name)
    if stopped:
        _kick(rt)  # a job that arrived while the net was stopping gets a fresh scale-up
    return stopped


def _stop_net(rt: Runtime, name: str, reason: str) -> None:
    """Drop the admin session, scale to 0, and record STOPPED once the driver agrees."""
    rt.forget_admin(name)  # the next scale-up must log in afresh, never reuse this session
    try:
        _scale(rt, name, 0, reason)
        observation = rt.driver(name).observe()
    except TransientError:
        log.warning("scale-down not confirmed yet; reconcile retries", extra={"net": name})
        return
    if observation.running == 0 and observation.pending == 0:
        with unit_of_work(rt.sessions) as session:
            net = services.get_net(session, name, lock=True)
            if net.state in (NetState.STOPPING, NetState.UNHEALTHY):
                net.transition(NetState.STOPPED, rt.clock(), reason)


def keep_alive_busy_nets(rt: Runtime) -> list[str]:
    """Ping only BUSY nets (refreshes the admin session); stopped and idle nets are left
    alone, so a scaled-to-zero server is never contacted."""
    with rt.sessions() as session:
        busy = list(session.scalars(select(Net.name).where(Net.state == NetState.BUSY)))
    pinged = []
    for name in busy:
        if name not in {n.name for n in rt.settings.nets}:
            continue
        try:
            rt.admin(name).ping()
            pinged.append(name)
        except TransientError as exc:
            log.warning("keep-alive failed", extra={"net": name, "reason": str(exc)})
    return pinged


@dataclass(frozen=True)
class Watched:
    """A running job as monitor sees it."""

    job_id: uuid.UUID
    state: JobState
    net_name: str
    nvflare_job_id: str
    server_start_time: float | None
    dispatched_at: datetime | None = None


def monitor_running_jobs(rt: Runtime) -> dict[str, str]:
    """Poll NVFLARE for every RUNNING/ABORTING job and settle the finished ones; a server
    that restarted under a job, or is gone past the grace, resolves it by LOST_JOB_POLICY."""
    with rt.sessions() as session:
        rows = session.execute(
            select(
                Job.id,
                Job.state,
                Job.net_name,
                Job.nvflare_job_id,
                Net.server_start_time,
                Job.dispatched_at,
            )
            .join(Net, Net.name == Job.net_name)
            .where(
                Job.state.in_((JobState.RUNNING, JobState.ABORTING)),
                Job.nvflare_job_id.is_not(None),
            )
        ).all()
    watched = [
        Watched(job_id, state, net_name, nvflare_job_id, start, dispatched_at)
        for job_id, state, net_name, nvflare_job_id, start, dispatched_at in rows
        if net_name is not None and nvflare_job_id is not None
    ]
    outcomes: dict[str, str] = {}
    for net_name in sorted({w.net_name for w in watched}):
        jobs = [w for w in watched if w.net_name == net_name]
        outcomes |= _monitor_net(rt, net_name, jobs)
    return outcomes


def _monitor_net(rt: Runtime, net_name: str, jobs: list[Watched]) -> dict[str, str]:
    admin = rt.admin(net_name)
    now = rt.clock()
    try:
        start_time = admin.server_start_time()
    except ServerUnavailable as exc:
        with unit_of_work(rt.sessions) as session:
            net = services.get_net(session, net_name, lock=True)
            if net.unreachable_since is None:
                net.unreachable_since = now
            gone_s = (now - net.unreachable_since).total_seconds()
        if gone_s < rt.settings.server_lost_grace_s:
            return {str(j.job_id): f"server unreachable for {gone_s:.0f}s" for j in jobs}
        return {
            str(j.job_id): _lost(rt, j, f"server unreachable for {gone_s:.0f}s: {exc}")
            for j in jobs
        }

    results: dict[str, str] = {}
    for job in jobs:
        if job.server_start_time is not None and start_time != job.server_start_time:
            # NVFLARE 2.9.0 keeps a killed run "RUNNING" forever after a restart (abort and
            # delete both refuse it), so the restart itself decides the job's fate.
            results[str(job.job_id)] = _lost(rt, job, "server restarted under the job")
            continue
        try:
            status = admin.job_status(job.nvflare_job_id)
        except DispatcherError as exc:
            results[str(job.job_id)] = f"status unknown: {exc}"
            continue
        if status in NVFLARE_OUTCOMES:
            with unit_of_work(rt.sessions) as session:
                services.finish_job(
                    session, job.job_id, NVFLARE_OUTCOMES[status], f"NVFLARE {status}", rt.clock()
                )
            _kick(rt)
        elif status in NVFLARE_LOST:
            results[str(job.job_id)] = _lost(rt, job, f"NVFLARE {status}")
            continue
        elif _overran(rt, job, now):
            results[str(job.job_id)] = _stop_overrun(rt, job, status)
            continue
        results[str(job.job_id)] = status
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, net_name, lock=True)
        net.unreachable_since = None
    return results


def _overran(rt: Runtime, job: Watched, now: datetime) -> bool:
    """A RUNNING job past its net's maximum run time."""
    if job.state != JobState.RUNNING or job.dispatched_at is None:
        return False
    net = rt.settings.net(job.net_name)
    max_run_s = net.max_run_s if net.max_run_s is not None else rt.settings.max_run_s
    return (now - job.dispatched_at).total_seconds() > max_run_s


def _stop_overrun(rt: Runtime, job: Watched, status: str) -> str:
    """Abort a run that outlived its limit and fail the job: a hung NVFLARE run (e.g. one
    whose clients crashed at start stays RUNNING in 2.9.0) must not keep a server up forever."""
    result = rt.admin(job.net_name).abort(job.nvflare_job_id)
    reason = f"exceeded the maximum run time (NVFLARE said {status}); abort: {result.outcome}"
    with unit_of_work(rt.sessions) as session:
        services.finish_job(session, job.job_id, JobState.FAILED, reason, rt.clock())
    log.error("run overran", extra={"job": str(job.job_id), "net": job.net_name, "reason": reason})
    _kick(rt)
    return "failed: overran"


def _lost(rt: Runtime, job: Watched, reason: str) -> str:
    """A run whose server was lost: requeue or fail per LOST_JOB_POLICY; an ABORTING job
    is simply ABORTED (the user wanted it stopped and it is)."""
    with unit_of_work(rt.sessions) as session:
        if job.state == JobState.ABORTING:
            services.finish_job(session, job.job_id, JobState.ABORTED, reason, rt.clock())
            outcome = "aborted"
        elif rt.settings.lost_job_policy == "requeue":
            outcome = (
                "requeued"
                if services.requeue_job(session, job.job_id, reason, rt.clock())
                else "failed"
            )
        else:
            services.finish_job(session, job.job_id, JobState.FAILED, reason, rt.clock())
            outcome = "failed"
    log.warning(
        "run lost",
        extra={"job": str(job.job_id), "net": job.net_name, "reason": reason, "outcome": outcome},
    )
    _kick(rt)
    return outcome


@dataclass(frozen=True)
class Reconciled:
    """What one reconcile round changed or re-drove."""

    redriven: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()


def reconcile(rt: Runtime) -> Reconciled:
    """Re-drive stuck jobs, settle nets whose chain was lost, repair drift between the nets
    table and what the driver sees, and watch always-on servers for an OUTAGE."""
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        services.sync_nets(session, rt.settings, now)
    redriven = _redrive_stuck_jobs(rt, now)
    repaired = []
    for net_config in rt.settings.nets:
        try:
            note = (
                _watch_always_on(rt, net_config.name)
                if rt.settings.is_always_on(net_config)
                else _repair_scaling_net(rt, net_config.name)
            )
        except MisconfigurationError as exc:
            _net_misconfigured(rt, net_config.name, None, str(exc))
            note = f"misconfigured: {exc}"
        except TransientError as exc:
            note = f"not checked: {exc}"
        if note:
            repaired.append(f"{net_config.name}: {note}")
    _kick(rt)
    return Reconciled(tuple(redriven), tuple(repaired))


def _redrive_stuck_jobs(rt: Runtime, now: datetime) -> list[str]:
    stuck_s = rt.settings.stuck_after_s
    redriven = []
    with rt.sessions() as session:
        jobs = session.execute(
            select(Job.id, Job.state, Job.net_name, Job.state_changed_at, Job.nvflare_job_id).where(
                Job.state.in_((JobState.ASSIGNED, JobState.DISPATCHING, JobState.ABORTING))
            )
        ).all()
    for job_id, state, net_name, changed_at, nvflare_job_id in jobs:
        age_s = (now - changed_at).total_seconds()
        if state == JobState.ASSIGNED:
            # The chain itself gives up at the readiness deadline; past that plus the stuck
            # margin, the chain is gone (lost message, dead worker): requeue the job.
            ready_timeout_s = (
                rt.settings.net(net_name).ready_timeout_s
                if net_name in {n.name for n in rt.settings.nets}
                else 0.0
            )
            deadline = ready_timeout_s + stuck_s
            if age_s > deadline:
                requeue_after_transient(rt, job_id, f"stuck in ASSIGNED for {age_s:.0f}s")
                redriven.append(f"{job_id}: requeued")
        elif state == JobState.DISPATCHING and age_s > stuck_s:
            rt.outbox.send(DISPATCH, job_id=str(job_id))  # same stored token: no second run
            redriven.append(f"{job_id}: dispatch re-sent")
        elif state == JobState.ABORTING and age_s > stuck_s:
            if nvflare_job_id is None:
                with unit_of_work(rt.sessions) as session:
                    services.finish_job(
                        session,
                        job_id,
                        JobState.ABORTED,
                        "abort while submitting; no run recorded",
                        now,
                    )
                redriven.append(f"{job_id}: aborted")
            else:
                rt.outbox.send(ABORT_ON_SERVER, job_id=str(job_id))
                redriven.append(f"{job_id}: abort re-sent")
    return redriven


def _net_row(rt: Runtime, name: str) -> tuple[NetState, datetime, Job | None]:
    """The net's state, when it entered it, and its active job if any."""
    with rt.sessions() as session:
        net = services.get_net(session, name)
        job = session.scalar(
            select(Job).where(Job.net_name == name, Job.state.in_(ACTIVE_JOB_STATES))
        )
        return net.state, net.state_changed_at, job


def _set_net_state(
    rt: Runtime, name: str, expected: NetState, target: NetState, reason: str
) -> bool:
    """Move a net only if it is still in `expected` (checked under the row lock)."""
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, name, lock=True)
        if net.state != expected:
            return False
        if target == NetState.READY:
            net.transition(NetState.READY, rt.clock(), reason)
            net.idle_since = rt.clock()
        else:
            net.transition(target, rt.clock(), reason)
        return True


def _repair_scaling_net(rt: Runtime, name: str) -> str:
    state, changed_at, job = _net_row(rt, name)
    now = rt.clock()
    age_s = (now - changed_at).total_seconds()
    if state in (NetState.BUSY, NetState.MISCONFIGURED):
        return ""  # monitor owns busy nets; a misconfigured one waits for a human
    if job is not None:
        return _redrive_lost_scale_up(rt, name, state, job, age_s)
    observation = rt.driver(name).observe()
    up = observation.running > 0 or observation.pending > 0 or observation.desired > 0
    if state in (NetState.STOPPING, NetState.UNHEALTHY):
        _stop_net(rt, name, f"settling {state}")
        return f"{state}: scale-down re-driven"
    if state == NetState.STARTING:
        # Its job went away (aborted, requeued) while the server came up.
        if observation.is_up:
            _set_net_state(rt, name, NetState.STARTING, NetState.READY, "up, no job: idle")
            return "STARTING without a job: now READY (idle)"
        if age_s > rt.settings.net(name).ready_timeout_s:
            if _set_net_state(rt, name, NetState.STARTING, NetState.STOPPING, "start abandoned"):
                _stop_net(rt, name, "start abandoned")
            return "STARTING without a job past the deadline: stopped"
        return ""
    if state == NetState.STOPPED and up and age_s > rt.settings.stuck_after_s:
        # Drift: a server runs that nobody uses (e.g. a crash between scale and commit).
        _scale(rt, name, 0, "drift: server up while STOPPED")
        return "drift: STOPPED net had a server; scaled to 0"
    if state == NetState.READY and not up:
        _set_net_state(rt, name, NetState.READY, NetState.STOPPED, "drift: server gone")
        return "drift: READY net had no server; now STOPPED"
    return ""


def _redrive_lost_scale_up(rt: Runtime, name: str, state: NetState, job: Job, age_s: float) -> str:
    """A STARTING net whose job is still ASSIGNED but whose driver was never asked for a
    replica lost its chain before scale_up ran (a lost message, a dead worker): start it
    again. Every step is idempotent, so a chain that was merely slow does no harm."""
    if state != NetState.STARTING or job.state != JobState.ASSIGNED:
        return ""
    if age_s <= rt.settings.stuck_after_s or rt.driver(name).observe().desired > 0:
        return ""
    rt.outbox.start_pipeline(str(job.id), name)
    return f"STARTING with no scale-up for {age_s:.0f}s: pipeline of job {job.id} re-driven"


def _watch_always_on(rt: Runtime, name: str) -> str:
    """An always-on server that cannot be reached is an OUTAGE, loudly; back again, READY."""
    state, _, job = _net_row(rt, name)
    server = rt.admin(name).server_state()
    if server == ServerState.STARTED:
        if state in (NetState.OUTAGE, NetState.STOPPED):
            target = NetState.BUSY if state == NetState.OUTAGE and job else NetState.READY
            _set_net_state(rt, name, state, target, "always-on server reachable")
            if state == NetState.OUTAGE:
                log.warning("outage over", extra={"net": name})
            return f"{state} -> {target}"
        return ""
    if state not in (NetState.OUTAGE, NetState.MISCONFIGURED, NetState.STARTING):
        _set_net_state(rt, name, state, NetState.OUTAGE, f"always-on server {server}")
        log.error("OUTAGE: always-on server unreachable", extra={"net": name, "server": server})
        return f"{state} -> OUTAGE"
    return ""

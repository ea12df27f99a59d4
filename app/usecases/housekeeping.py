"""Housekeeping that beat drives: idle scale-down, keep-alive of BUSY nets, monitoring of
running jobs, and the reconciler that re-drives anything stuck and repairs drift."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import exists, or_, select

from app import names
from app.adapters.nvflare.base import ServerState
from app.db import unit_of_work
from app.errors import (
    DispatcherError,
    MisconfigurationError,
    ServerUnavailable,
    TransientError,
)
from app.runtime import Runtime
from app.usecases import services
from app.usecases.dispatch import NVFLARE_LOST, NVFLARE_OUTCOMES, requeue_after_transient
from app.usecases.scaling import kick, net_misconfigured, scale_net, stop_net
from models import ACTIVE_JOB_STATES, Job, JobState, Net, NetState

log = logging.getLogger(__name__)


def _scaling_nets(rt: Runtime) -> list[str]:
    return [n.name for n in rt.settings.nets if not n.always_on]


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
        stop_net(rt, name, "idle grace passed")
        stopped.append(name)
    if stopped:
        kick(rt)  # a job that arrived while the net was stopping gets a fresh scale-up
    return stopped


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
            kick(rt)
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
    kick(rt)
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
    kick(rt)
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
                if net_config.always_on
                else _repair_scaling_net(rt, net_config.name)
            )
        except MisconfigurationError as exc:
            net_misconfigured(rt, net_config.name, None, str(exc))
            note = f"misconfigured: {exc}"
        except TransientError as exc:
            note = f"not checked: {exc}"
        if note:
            repaired.append(f"{net_config.name}: {note}")
    kick(rt)
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
            rt.outbox.send(names.DISPATCH, job_id=str(job_id))  # same stored token: no second run
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
                rt.outbox.send(names.ABORT_ON_SERVER, job_id=str(job_id))
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
        stop_net(rt, name, f"settling {state}")
        return f"{state}: scale-down re-driven"
    if state == NetState.STARTING:
        # Its job went away (aborted, requeued) while the server came up.
        if observation.is_up:
            _set_net_state(rt, name, NetState.STARTING, NetState.READY, "up, no job: idle")
            return "STARTING without a job: now READY (idle)"
        if age_s > rt.settings.net(name).ready_timeout_s:
            if _set_net_state(rt, name, NetState.STARTING, NetState.STOPPING, "start abandoned"):
                stop_net(rt, name, "start abandoned")
            return "STARTING without a job past the deadline: stopped"
        return ""
    if state == NetState.STOPPED and up and age_s > rt.settings.stuck_after_s:
        # Drift: a server runs that nobody uses (e.g. a crash between scale and commit).
        scale_net(rt, name, 0, "drift: server up while STOPPED")
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

"""Scale decisions shared by the dispatch chain and housekeeping: ask a driver, record the
decision and its outcome, take a net out of service, put back a net whose start never
began, and kick the assigner."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app import names
from app.db import unit_of_work
from app.errors import (
    DispatcherError,
    MisconfigurationError,
    TransientError,
)
from app.runtime import Runtime
from app.usecases import records
from models import JobState, NetState, ScaleEvent

log = logging.getLogger(__name__)


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
            outcome=outcome[:200],  # the column's VARCHAR(200)
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


def scale_net(rt: Runtime, net: str, replicas: int, reason: str) -> None:
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


def runs_revive(rt: Runtime, name: str) -> bool:
    """The net's server keeps its pending runs across a restart (`NetConfig.pending_runs_revive`):
    its stray runs outlive it (app.usecases.revived_runs)."""
    return rt.settings.has_net(name) and rt.settings.net(name).pending_runs_revive


def kick(rt: Runtime) -> None:
    """Ask a worker to assign QUEUED jobs (after the commit that freed a net or queued one)."""
    rt.outbox.send(names.ASSIGN_NEXT_JOB)


def net_misconfigured(
    rt: Runtime,
    net_name: str,
    job_id: uuid.UUID | None,
    reason: str,
    *,
    attempt: tuple[JobState, int] | None = None,
) -> bool:
    """Fail loud: the net needs a human; its job goes back to the queue without losing an
    attempt (it is not the job's fault), and a scale-to-zero net is scaled down.
    `attempt` (the state and attempt number the caller's step was started for, on this
    net): a step acts only on what it still owns, so if the job moved on meanwhile (a re-sent
    submit adopted its run, it is on its next attempt) everything is left as it is. A
    DISPATCHING job's submit may have landed on an earlier try: that run is kept as a stray
    before the job goes back to the queue. A job claimed onto the net since the caller read
    it (a round that saw the net free, a monitor that settled its jobs) is left to its own
    chain, which meets the misconfiguration itself: a net is never marked under an active job.
    True when the net was marked."""
    with unit_of_work(rt.sessions) as session:
        if job_id is not None and attempt is not None:
            job = records.get_job(session, job_id, lock=True)
            if (job.state, job.attempts, job.net_name) != (*attempt, net_name):
                log.info(
                    "misconfiguration seen by a step whose job moved on; left to it",
                    extra={"net": net_name, "job": str(job_id), "state": str(job.state)},
                )
                return False
            if job.state == JobState.DISPATCHING:
                records.add_stray_run(
                    session,
                    net_name=net_name,
                    job_id=job_id,
                    nvflare_job_id=None,
                    submit_token=job.submit_token,
                    reason=f"submit outcome unknown: net {net_name} misconfigured",
                    now=rt.clock(),
                )
        if job_id is not None:
            records.requeue_job(
                session,
                job_id,
                f"net {net_name} misconfigured: {reason}",
                rt.clock(),
                count_attempt=False,
            )
        net = records.get_net(session, net_name, lock=True)
        other = records.active_job(session, net_name)
        if other is not None:
            log.info(
                "misconfiguration seen; a job claimed the net meanwhile: left to its chain",
                extra={"net": net_name, "job": str(other.id), "reason": reason},
            )
            return False
        net.transition(NetState.MISCONFIGURED, rt.clock(), reason)
        net.last_error = reason
    log.error("net misconfigured", extra={"net": net_name, "job": str(job_id), "reason": reason})
    if rt.settings.net(net_name).scales_to_zero:
        scale_down_or_log(rt, net_name, "net misconfigured")
    kick(rt)
    return True


# The states a net is in while a scale-down of it is wanted. A claim takes a net only from
# READY, STARTING or STOPPED (with no job), so a net in one of these, with no active job,
# is not one a job can be using.
_DOWN_BOUND = (NetState.STOPPING, NetState.UNHEALTHY, NetState.STOPPED, NetState.MISCONFIGURED)


def stop_net(rt: Runtime, name: str, reason: str) -> bool:
    """Drop the admin session, scale to 0 (`scale_down`), and record STOPPED once the driver
    agrees; runs the server held die with it, so its stray runs are settled. True when
    confirmed."""
    rt.forget_admin(name)  # the next scale-up must log in afresh, never reuse this session
    try:
        down = scale_down(rt, name, reason)
    except TransientError:
        log.warning("scale-down not confirmed yet; reconcile retries", extra={"net": name})
        return False
    if not down:
        return False
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        if _claimed(session, name, net.state):
            return False  # claimed once the server was down: its job scales it up
        if net.state in (NetState.STOPPING, NetState.UNHEALTHY):
            net.transition(NetState.STOPPED, rt.clock(), reason)
        records.clear_stray_runs(session, name, runs_revive=runs_revive(rt, name))
    return True


def scale_down(rt: Runtime, name: str, reason: str) -> bool:
    """Scale a net no job holds to 0; True when the driver confirms no replica runs or
    starts. Every scale-down goes through here (driver errors propagate).

    The call is leased (`Net.stop_due_at`, STUCK_AFTER_S): reconcile does not re-drive the
    stop, and so cannot finish it and let a job claim the net, while this call may still
    land. No platform has a conditional scale, so a call that lands later than that (a
    frozen worker, a platform that answers after minutes) can still take the server of a
    net claimed since: the net is read again after the call, and one that moved on gets
    its replica back at once. A net claimed before the call is not called at all."""
    lease = _lease_stop(rt, name)
    if lease is None:
        return False  # claimed since (its job owns the server), or another call is in flight
    try:
        scale_net(rt, name, 0, reason)
        observation = rt.driver(name).observe()
    except DispatcherError:
        # Over from this side (a reply lost may still have applied it): reconcile retries
        # once no lease is left, and a net claimed meanwhile keeps its replica.
        if _end_lease(rt, name, lease)[1]:
            _undo_late_stop(rt, name, reason)
        raise
    ended, overtaken = _end_lease(rt, name, lease)
    if overtaken:
        _undo_late_stop(rt, name, reason)
        return False
    # Landed past its lease (not `ended`): reconcile may have a call of its own in flight,
    # which records the net down; this one never does under it.
    return ended and not (observation.running or observation.pending)


def scale_down_or_log(rt: Runtime, name: str, reason: str) -> None:
    """`scale_down` where a failure is logged, not raised: the net's state (UNHEALTHY,
    MISCONFIGURED) already says its server must go, and reconcile re-drives that."""
    try:
        scale_down(rt, name, reason)
    except DispatcherError as exc:
        log.error(
            "scale-down failed; reconcile retries",
            extra={"net": name, "why": reason, "reason": str(exc)},
        )


def stop_in_flight(due: datetime | None, now: datetime) -> bool:
    """A scale-down call of the net may still land: the lease it took (`Net.stop_due_at`)
    has not passed."""
    return due is not None and now <= due


def _lease_stop(rt: Runtime, name: str) -> datetime | None:
    """Under the row lock claims take: the net still wants its scale-down (no job has
    claimed it since) and no other scale-down call of it is in flight (one at a time: that
    call records the net down when it lands, or reconcile once its lease has passed); this
    call then holds it until STUCK_AFTER_S from now. None: make no call. A net already
    STOPPED had its stop finished by another (its worker paused before this lease): a
    claim may take a STOPPED net while a call is on the wire, so none is made."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        now = rt.clock()
        if net.state == NetState.STOPPED or _claimed(session, name, net.state):
            return None
        if stop_in_flight(net.stop_due_at, now):
            return None
        net.stop_due_at = now + timedelta(seconds=rt.settings.stuck_after_s)
        return net.stop_due_at


def _end_lease(rt: Runtime, name: str, lease: datetime) -> tuple[bool, bool]:
    """The call has returned. (ended, overtaken): its lease ended (it is still the net's:
    past it, reconcile may have re-driven the stop with a lease of its own); the net was
    claimed meanwhile (the call landed late)."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        ended = net.stop_due_at == lease
        if ended:
            net.stop_due_at = None
        return ended, _claimed(session, name, net.state)


def _undo_late_stop(rt: Runtime, name: str, reason: str) -> None:
    """The scale-down landed on a net claimed since (its worker was paused past its lease):
    the replica goes back at once, so the claimed job's server is not left to readiness
    deadlines or the monitor; a run it held died and is resolved like any restart."""
    log.error(
        "a scale-down landed after its net was claimed again; replica put back",
        extra={"net": name, "reason": reason},
    )
    scale_net(rt, name, 1, "a late scale-down undone: the net was claimed meanwhile")


def _claimed(session: Session, name: str, state: NetState) -> bool:
    """A job holds the net, or it is on its way up for one (or was, and is idle now)."""
    return state not in _DOWN_BOUND or records.active_job(session, name) is not None


def take_down(rt: Runtime, name: str, reason: str) -> bool:
    """Take a scale-to-zero net's server away now, whatever it runs (a run that cannot be
    stopped otherwise dies with its server). Holds the row lock assignment takes, so no job
    is claimed onto a server that is going away. Returns True once confirmed down."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        if records.active_job(session, name) is not None:
            return False  # a job was claimed meanwhile: it owns the server now
        if net.state in (NetState.READY, NetState.STOPPED, NetState.STARTING, NetState.OUTAGE):
            net.transition(NetState.STOPPING, rt.clock(), reason)
        elif net.state == NetState.BUSY:
            net.transition(NetState.UNHEALTHY, rt.clock(), reason)
    return stop_net(rt, name, reason)


def release_unstarted_net(rt: Runtime, net_name: str, job_id: uuid.UUID) -> None:
    """The claim moved a stopped net to STARTING, but the job failed before its scale-up (a
    missing bundle): nothing was started, so the net is STOPPED again now, instead of
    reading STARTING until reconcile gives the start up after `ready_timeout_s`. A net the
    driver was asked to start, or that another job has claimed meanwhile, is left alone."""
    with rt.sessions() as session:
        if records.get_net(session, net_name).state != NetState.STARTING:
            return
    if not rt.settings.net(net_name).scales_to_zero:
        return
    try:
        observation = rt.driver(net_name).observe()
    except DispatcherError as exc:
        log.warning(
            "net left STARTING: its driver did not answer; reconcile settles it",
            extra={"net": net_name, "job": str(job_id), "reason": str(exc)},
        )
        return
    if observation.desired or observation.running or observation.pending:
        return
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, net_name, lock=True)
        if net.state == NetState.STARTING and records.active_job(session, net_name) is None:
            net.transition(NetState.STOPPED, rt.clock(), f"job {job_id} failed before any scale-up")

"""The reconciler's round: re-drive jobs stuck in ASSIGNED, DISPATCHING or ABORTING, settle
work on undeclared nets and stray runs, remove the prepared copies and cached bundles of
jobs that ended, and have each declared net repaired (`net_repairs`)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select

from app import names
from app.adapters.jobdefs import cached_bundle_jobs, discard, prepared_jobs, sweep_prepared
from app.db import unit_of_work
from app.errors import MisconfigurationError, TransientError
from app.runtime import Runtime
from app.usecases import declared_nets, heartbeat
from app.usecases.abort import expire_abort, expire_stray_runs, resting, settle_stray_runs
from app.usecases.fleet import Fleet, read_fleet
from app.usecases.housekeeping import isolated
from app.usecases.net_repairs import (
    repair_scaling_net,
    settle_misconfigured,
    watch_always_on,
)
from app.usecases.outages import start_age_s
from app.usecases.retries import requeue_after_transient
from app.usecases.scaling import kick
from app.usecases.step_leases import Leased, lapsed, redrive_lapsed_steps, retry_budget_s
from app.usecases.undeclared import settle_undeclared
from app.usecases.unknown_submit import abandon_dispatch
from models import TERMINAL_JOB_STATES, Job, JobState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reconciled:
    """What one reconcile round changed or re-drove."""

    redriven: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()


def reconcile(rt: Runtime) -> Reconciled:
    """Re-drive stuck jobs, settle stray runs and nets whose chain was lost, repair drift
    between the nets table and what the driver sees, and watch always-on servers for an
    OUTAGE. Each net is handled on its own: one net's failure never stops the others."""
    now = rt.clock()
    # One read for the fleet (issue 37: it was seven); each decision re-checks under lock.
    fleet = _fleet(rt, now)
    rows = fleet.rows
    # The removed nets and how far back their sites may have left jobs no net can run.
    removal = declared_nets.removal(fleet.declared_at, rt.settings, now)
    removed = removal.removed
    # Lapsed leases first (also every monitor round): a job whose step's worker is gone.
    redrive = redrive_lapsed_steps(rt, fleet.chain_jobs, now)
    lease_lapsed = [f"{job}: {what}" for job, what in redrive.items()]
    # A job on a removed net is settled there, never also re-driven on the round's read.
    stuck = [job for job in fleet.chain_jobs if job.net_name not in removed]
    redriven = settle_undeclared(rt, removal) + lease_lapsed + _redrive_stuck_jobs(rt, now, stuck)
    _sweep_prepared(rt)
    _discard_finished_bundles(rt)
    repaired = []
    # `_fleet` made every declared net's row; one deleted by hand since is left alone this
    # round (no failure recorded on a row another process may have made again meanwhile).
    read = [(net_config, rows[net_config.name]) for net_config in rt.settings.nets
            if net_config.name in rows]  # fmt: skip
    for net_config, row in read:
        note: str = ""  # a net whose repair raised (`isolated` records it) reports nothing
        with isolated(rt, "reconcile", net_config.name):
            try:
                note = (
                    watch_always_on(rt, net_config.name, row)
                    if net_config.always_on
                    else repair_scaling_net(rt, net_config.name, row)
                )
                # (A net read without strays would read none to settle; a resting one has
                # no server to ask.)
                if row.strays and not resting(rt, net_config.name):
                    left = settle_stray_runs(rt, net_config.name)
                    if left:
                        taken_down = expire_stray_runs(rt, net_config.name)
                        note = (note + "; " if note else "") + f"{left} stray run(s) unsettled"
                        note += "; net taken down" if taken_down else ""
            except MisconfigurationError as exc:
                note = settle_misconfigured(rt, net_config.name, row, exc)
            except TransientError as exc:
                note = f"not checked: {exc}"
        if note:
            repaired.append(f"{net_config.name}: {note}")
    if redriven or repaired:
        kick(rt)  # what it freed or requeued; a round that changed nothing asks for nothing
    with unit_of_work(rt.sessions) as session:
        heartbeat.record_run(session, heartbeat.RECONCILE, rt.clock())
    return Reconciled(tuple(redriven), tuple(repaired))


def _fleet(rt: Runtime, now: datetime) -> Fleet:
    """The round's read of every net; a declared net with no row yet gets one first (read
    again then), and the nets this process declares whose stamp is `restamp_after_s` old
    are stamped again (most rounds write nothing)."""
    with rt.sessions() as session:
        fleet = read_fleet(session)
    if any(net.name not in fleet.rows for net in rt.settings.nets):
        with unit_of_work(rt.sessions) as session:
            declared_nets.sync_nets(session, rt.settings, now)
        with rt.sessions() as session:
            fleet = read_fleet(session)
    since = now - timedelta(seconds=declared_nets.restamp_after_s(rt.settings))
    stale = [
        net.name
        for net in rt.settings.nets
        if (at := fleet.declared_at.get(net.name)) is None or at < since
    ]
    if stale:
        with unit_of_work(rt.sessions) as session:
            declared_nets.note_declared(session, rt.settings, now, stale)
    return fleet


def _sweep_prepared(rt: Runtime) -> None:
    """Remove the prepared copies of jobs that ended (or no longer exist): those never run
    again, so no submit can be racing the removal."""
    try:
        prepared = prepared_jobs(rt.settings)
        live = _live_jobs(rt, {uuid.UUID(name) for name in prepared if _is_uuid(name)})
        sweep_prepared(rt.settings, prepared - {str(job_id) for job_id in live})
    except OSError as exc:
        log.warning("removing prepared job copies failed", extra={"reason": str(exc)})


def _live_jobs(rt: Runtime, job_ids: set[uuid.UUID]) -> set[uuid.UUID]:
    """Those of these jobs that have not ended (one that no longer exists has)."""
    if not job_ids:
        return set()  # no copy, no cached bundle: nothing to ask (most rounds)
    with rt.sessions() as session:
        # Only these: the query stays as small as the caller's set, not the live queue.
        query = select(Job.id).where(
            Job.id.in_(job_ids),
            Job.state.not_in(TERMINAL_JOB_STATES),
        )
        return set(session.scalars(query))


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _discard_finished_bundles(rt: Runtime) -> list[uuid.UUID]:
    """Delete the cached S3 bundles of jobs that ended or no longer exist.

    Unlike the prepared copies, a QUEUED job keeps its bundle, so a requeue downloads only
    the objects whose ETag changed.
    """
    try:
        cached = cached_bundle_jobs(rt.settings)
        if not cached:
            return []
        finished = sorted(cached - _live_jobs(rt, cached))
        for job_id in finished:
            discard(rt.settings, job_id)
    except OSError as exc:
        # A full or read-only data folder must not stop the rest of reconcile.
        log.warning("removing cached S3 bundles failed", extra={"reason": str(exc)})
        return []
    if finished:
        log.info("cached S3 bundles removed", extra={"jobs": [str(j) for j in finished]})
    return finished


def _redrive_stuck_jobs(rt: Runtime, now: datetime, jobs: list[Leased]) -> list[str]:
    """Act on the jobs of the round's read stuck in ASSIGNED, DISPATCHING or ABORTING."""
    stuck_s = rt.settings.stuck_after_s
    redriven = []
    for job_id, state, net_name, attempt, changed_at, due_at in (
        (j.job_id, j.state, j.net_name, j.attempt, j.changed_at, j.due_at) for j in jobs
    ):
        age_s = (now - changed_at).total_seconds()
        known = rt.settings.has_net(net_name)
        # "-" (no net, a hand-edited row): log text only, as "XX-XX" would be: no net's name.
        with isolated(rt, "reconcile", net_name or "-"):  # pragma: no mutate (see above)
            if state == JobState.ASSIGNED:
                # The chain itself gives up at the readiness deadline; past that plus the
                # stuck margin, the chain is gone for good (its re-drives on a lapsed lease
                # never got through, or a row from before the lease): requeue.
                # `or ""` never applies (a known net has a name; it is there for mypy): its
                # "XXXX" is never read; its `and` is killed (test_redrive_and_monitor).
                ready_timeout_s = (
                    rt.settings.net(net_name or "").ready_timeout_s  # pragma: no mutate (see above)
                    if known
                    else 0.0
                )
                # The chain's deadline counts from a late scale_up's ask (`start_age_s`).
                if age_s > ready_timeout_s + stuck_s and (
                    not known
                    or start_age_s(rt, net_name or "", changed_at, now, taken=True)
                    > ready_timeout_s + stuck_s
                ):
                    requeue_after_transient(
                        rt,
                        job_id,
                        f"stuck in ASSIGNED for {age_s:.0f}s",
                        net_name=net_name,
                        attempt=attempt,
                    )
                    redriven.append(f"{job_id}: requeued")
            elif state == JobState.DISPATCHING:
                if not lapsed(due_at, now):
                    continue  # a worker still holds the submit: its own retries go on
                # Within the budget its submit was re-sent above (redrive_lapsed_steps).
                if age_s > retry_budget_s(rt.settings) + stuck_s:
                    abandon_dispatch(rt, job_id, f"submit outcome unknown for {age_s:.0f}s")
                    redriven.append(f"{job_id}: dispatch abandoned, token settled")
            elif state == JobState.ABORTING:
                if age_s > rt.settings.abort_timeout_s:
                    expire_abort(rt, job_id)
                    redriven.append(f"{job_id}: abort expired")
                elif age_s > rt.settings.housekeeping_interval_s:
                    # Each round until it expires: an abort the server could not confirm
                    # is sent again while the run may still go on (gated by STUCK_AFTER_S,
                    # 300 s as ABORT_TIMEOUT_S by default, it was never sent again).
                    rt.outbox.send(names.ABORT_ON_SERVER, job_id=str(job_id))
                    redriven.append(f"{job_id}: abort re-sent")
    return redriven

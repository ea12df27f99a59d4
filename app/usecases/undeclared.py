"""Work left on nets a redeploy removed from NETS, settled by the reconciler: nothing here
can reach their servers any more."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from sqlalchemy import func, or_, select

from app.db import unit_of_work
from app.runtime import Runtime
from app.settings import Settings
from app.usecases import declared_nets, records
from app.usecases.housekeeping import isolated
from models import ACTIVE_JOB_STATES, Job, JobState, Net, ReasonCode, StrayRun

log = logging.getLogger(__name__)


def undeclared_reason(net_name: str) -> str:
    """Why work on a net that NETS no longer declares was settled."""
    return (
        f"net {net_name} is no longer declared (NETS): its server is no longer watched "
        "or scaled; stop it by hand if it still runs"
    )


def unrunnable_reason(sites: Sequence[str]) -> str:
    """Why an unpinned job that no declared net can run was settled."""
    return (
        f"no declared net has every site in {list(sites)}: the nets that had them are no "
        "longer declared (NETS), so it can never run"
    )


def runnable(settings: Settings, sites: Sequence[str]) -> bool:
    """May some declared net run a job needing these sites (`NetConfig.lacks`: a net that
    does not declare its sites may have any)? As an unpinned enqueue checks them."""
    return any(not net.lacks(sites) for net in settings.nets)


def settle_undeclared(rt: Runtime, removal: declared_nets.Removal | None = None) -> list[str]:
    """Settle the work left on nets a redeploy removed from NETS: nothing here can reach
    their servers any more. A job only claimed there goes back to the queue (its attempt
    kept); a job that may have a run there, or whose earlier run may still be there (a
    stray), FAILS with the reason: running it elsewhere could make a second live run; its run
    is kept as a stray (a net declared again takes no job beside it). An ABORTING job is
    ABORTED; a FINISHING one is left to flip-api's report or its timeout
    (its run is over). A QUEUED job pinned to such a net fails: it can never run; so does
    an unpinned QUEUED one whose sites no declared net has (the removed nets had them).

    A net counts as removed only once no process has declared it for a while
    (`declared_nets.undeclared_nets`): a worker still on the previous NETS during a rolling deploy
    never settles the jobs of a net just added. `removal`: those nets as the round read
    them (else read here)."""
    if removal is None:
        with rt.sessions() as session:
            stamps = {name: at for name, at in session.execute(select(Net.name, Net.declared_at))}
        removal = declared_nets.removal(stamps, rt.settings, rt.clock())
    removed = removal.removed
    if not removed:
        return []
    arms = [
        Job.state.in_(ACTIVE_JOB_STATES) & Job.net_name.in_(removed),
        (Job.state == JobState.QUEUED) & Job.requested_net.in_(removed),
    ]
    if removal.sites_horizon is not None:
        # In the same read (no statement more per round): the unpinned jobs queued while a
        # removed net may have been the only one with their sites; the check is below.
        arms.append(
            (Job.state == JobState.QUEUED)
            & Job.requested_net.is_(None)
            & (Job.created_at < removal.sites_horizon)
        )
    with rt.sessions() as session:
        jobs = session.execute(
            # Each with the removed net it is settled for: the one it holds (an active job)
            # or is pinned to (a QUEUED one); the filter makes it one of `removed`. None: an
            # unpinned QUEUED job (a QUEUED job holds no net), read for its sites.
            select(
                Job.id, func.coalesce(Job.net_name, Job.requested_net), Job.required_sites
            ).where(or_(*arms))
        ).all()
        strays = session.execute(
            select(StrayRun.id, StrayRun.job_id, StrayRun.net_name).where(
                StrayRun.net_name.in_(removed)
            )
        ).all()
    settled = []
    for job_id, net_name, sites in jobs:
        if net_name is None:
            # The check too is inside the isolation: a row it cannot read (sites JSON null, a
            # hand edit) is that job's failure, not the round's for every net.
            # Its mutants ("XX-XX", the loop's name) change only the log: no net row is named so.
            with isolated(rt, "reconcile", "-"):  # pragma: no mutate (log text: no net named "-")
                if not runnable(rt.settings, sites):  # (most are: a declared net has them)
                    note = _settle_unrunnable_job(rt, job_id)
                    if note:
                        settled.append(f"{job_id}: {note}")
            continue
        with isolated(rt, "reconcile", net_name):
            note = _settle_undeclared_job(rt, job_id, removed)
            if note:
                settled.append(f"{job_id}: {note}")
    for _stray_id, job_id, net_name in strays:
        # The stray itself is kept: should the net be declared again, it takes no job until
        # that run is settled. Only a QUEUED job waiting on it is ended.
        with isolated(rt, "reconcile", net_name):
            with unit_of_work(rt.sessions) as session:
                job = records.get_job(session, job_id, lock=True)
                if job.state != JobState.QUEUED:
                    continue
                records.finish_job(
                    session,
                    job_id,
                    JobState.FAILED,
                    f"an earlier run may still be live: {undeclared_reason(net_name)}",
                    rt.clock(),
                    code=ReasonCode.NET_REMOVED,
                )
            log.error(
                "job waiting on a run on an undeclared net failed",
                extra={"net": net_name, "job": str(job_id), "reason": undeclared_reason(net_name)},
            )
            settled.append(f"{job_id}: failed: its earlier run is on undeclared net {net_name}")
    if removal.unstamped:
        # Once: the jobs queued so far were read; later rounds read none queued after this.
        with isolated(rt, "reconcile", removal.unstamped[0]), unit_of_work(rt.sessions) as s:
            declared_nets.stamp_unstamped(s, removal, rt.settings)
    return settled


def _settle_unrunnable_job(rt: Runtime, job_id: uuid.UUID) -> str:
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        # Its sites and pin are as the round read them (set at enqueue, never changed), and so
        # are this process's NETS: only its state can have moved on since the read.
        if job.state != JobState.QUEUED:
            return ""  # the job moved on since the read
        reason = unrunnable_reason(job.required_sites)
        records.finish_job(
            session, job_id, JobState.FAILED, reason, rt.clock(), code=ReasonCode.NET_REMOVED
        )
    log.error("job no declared net can run failed", extra={"job": str(job_id), "reason": reason})
    return "failed: no declared net has its sites"


def _settle_undeclared_job(rt: Runtime, job_id: uuid.UUID, removed: list[str]) -> str:
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        net_name = job.net_name if job.state in ACTIVE_JOB_STATES else job.requested_net
        if net_name is None or net_name not in removed:
            return ""  # the job moved on since the read
        reason = undeclared_reason(net_name)
        if job.state == JobState.ASSIGNED:
            records.requeue_job(session, job_id, reason, rt.clock(), count_attempt=False)
            if job.requested_net == net_name:
                records.finish_job(
                    session,
                    job_id,
                    JobState.FAILED,
                    reason,
                    rt.clock(),
                    code=ReasonCode.NET_REMOVED,
                )
                return "failed: pinned to an undeclared net"
            return "requeued from an undeclared net"
        if job.state == JobState.FINISHING:
            return ""
        outcome = JobState.ABORTED if job.state == JobState.ABORTING else JobState.FAILED
        # Its run may still live on that server: counted as a stray, so that the net, if it
        # is ever declared again, takes no job beside it before it is settled.
        records.add_stray_run(
            session,
            net_name=net_name,
            job_id=job_id,
            nvflare_job_id=job.nvflare_job_id,
            submit_token=job.submit_token,
            reason=reason,
            now=rt.clock(),
        )
        records.finish_job(
            session, job_id, outcome, reason, rt.clock(), code=ReasonCode.NET_REMOVED
        )
    log.error("job on an undeclared net settled", extra={"job": str(job_id), "net": net_name})
    return f"{outcome.lower()}: on undeclared net {net_name}"

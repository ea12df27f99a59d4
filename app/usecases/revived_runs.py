"""Runs a net's server starts again after a restart while no job counts them any more: a
Flower SuperLink with its state database keeps the runs still pending when it died, and its
SuperExec starts them once it is up again (flwr 1.42): the job's earlier attempt would run
beside its next one (`NetConfig.pending_runs_revive`). Such a net's stray runs are no longer
taken for gone with its server (`records.clear_stray_runs`: kept until a server that answers
settles them, a STOPPED net holding one started to do so); this stop is the defence for a
revived run that no stray names.

So before a job is submitted on such a net (its readiness), every run the server holds live
is one no job counts (the net has no other active job, and a stray run keeps jobs off it):
each is stopped (a stop is final in Flower), and the net is not ready until none is left.
The runs are listed first and the job read after: a duplicate chain of the same attempt
(a step re-driven beside itself) that has submitted meanwhile moved the job on before its
run could be listed, and then nothing is stopped."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection
from functools import partial

from sqlalchemy import exists, select

from app.adapters.backend import AbortOutcome
from app.errors import DispatcherError
from app.runtime import Runtime
from app.usecases import records
from app.usecases.housekeeping import isolated, round_deadline_s
from models import ACTIVE_JOB_STATES, Job, JobState, Net, NetState

log = logging.getLogger(__name__)

STOPPED = (AbortOutcome.ABORTED, AbortOutcome.ALREADY_FINISHED)


def stop_before_submit(rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int) -> str | None:
    """Stop the runs the net's server holds live before this ASSIGNED job is submitted
    there: None when none is left (or the job moved on: the readiness check says so), else
    why the net is not ready yet. TransientError when the server cannot list or stop them
    (the readiness poll tries again)."""
    if not rt.settings.net(net_name).pending_runs_revive:
        return None
    admin = rt.admin(net_name)
    live = sorted(admin.live_runs())
    if not live:
        return None
    with rt.sessions() as session:
        job = records.get_job(session, job_id)
        if (job.state, job.net_name, job.attempts) != (JobState.ASSIGNED, net_name, attempt):
            return None  # another chain of the attempt submitted: one of these may be its run
    left = []
    for run_id in live:
        result = admin.abort(run_id)
        log.error(
            "a run no job counts was live on the server before a submit; stopped",
            extra={"net": net_name, "nvflare_job_id": run_id, "outcome": str(result.outcome)},
        )
        if result.outcome not in STOPPED:
            left.append(run_id)
    return f"runs no job counts still live: {', '.join(left)}" if left else None


# A job in these states has its run recorded (or has none to come): any other live run on
# its net is one no job counts. ASSIGNED and DISPATCHING may have a submit in flight.
RUN_RECORDED = (JobState.RUNNING, JobState.ABORTING, JobState.FINISHING)


def stop_uncounted_runs(rt: Runtime, net_name: str, watched: Collection[str] = ()) -> list[str]:
    """While a job runs on a net whose server keeps no submit token (Flower), stop every run
    the server holds live that the net's job does not count: a later run of the job's own
    token whose start-run lost its reply, its submit's lookup refused and its retries spent
    with the SuperLink unreachable, has no step left to look the token up (simulation seed
    508), and would run beside the job's. Listed first and the net's jobs read after, so a
    run submitted meanwhile is either recorded or its job is still submitting (then nothing
    is stopped). The monitor calls it each round once the server answers, with the runs it
    watches there (none other live: no statement); the runs stopped. One it cannot list or
    stop now is tried again next round."""
    if not rt.settings.net(net_name).tokens_by_lookup:
        return []
    admin = rt.admin(net_name)
    try:
        live = admin.live_runs()
    except DispatcherError as exc:
        log.warning("live runs not listed", extra={"net": net_name, "reason": str(exc)})
        return []
    if live <= set(watched):
        return []
    with rt.sessions() as session:
        jobs = session.execute(
            select(Job.state, Job.nvflare_job_id).where(
                Job.net_name == net_name, Job.state.in_(ACTIVE_JOB_STATES)
            )
        ).all()
    if any(state not in RUN_RECORDED for state, _ in jobs):
        return []  # a submit may be in flight: its run may be among these, not yet recorded
    stopped = []
    for run_id in sorted(live - {run for _, run in jobs}):
        try:
            result = admin.abort(run_id)
        except DispatcherError as exc:
            log.warning("run not stopped", extra={"net": net_name, "reason": str(exc)})
            continue
        landed = result.outcome in STOPPED  # (NOTHING_TO_ABORT: a SuperLink not reached)
        log.error(
            "a run no job counts was live beside the net's job; "
            + ("stopped" if landed else "stop did not land, tried again next round"),
            extra={"net": net_name, "nvflare_job_id": run_id, "outcome": str(result.outcome)},
        )
        if landed:
            stopped.append(run_id)
    return stopped


def stop_uncounted_on(rt: Runtime, runs: dict[str, list[str]]) -> None:
    """`stop_uncounted_runs` on each of these nets (name -> the runs its jobs count) whose
    server keeps no submit token, in parallel, each on its own (one net's failure never
    stops the others')."""
    nets = [n for n in runs if rt.settings.has_net(n) and rt.settings.net(n).tokens_by_lookup]

    def stop(net_name: str) -> None:
        with isolated(rt, "monitor_running_jobs", net_name):
            stop_uncounted_runs(rt, net_name, runs[net_name])

    if nets:
        rt.fan_out.run({n: partial(stop, n) for n in nets}, round_deadline_s(rt))


def idle_always_on(rt: Runtime) -> list[str]:
    """The always-on nets whose server keeps no submit token that idle READY with no job:
    their server stays up, so a later run a blip left live as its job ended (the list of
    live runs refused in the very round that ended the job, no job holding the net after)
    would run until the next job's readiness. No statement without such nets."""
    names = [n.name for n in rt.settings.nets if n.always_on and n.tokens_by_lookup]
    if not names:
        return []
    with rt.sessions() as session:
        return list(
            session.scalars(
                select(Net.name).where(
                    Net.name.in_(names),
                    Net.state == NetState.READY,
                    ~exists().where(Job.net_name == Net.name, Job.state.in_(ACTIVE_JOB_STATES)),
                )
            )
        )

"""Housekeeping that beat drives: idle scale-down, keep-alive of BUSY nets, monitoring of
running jobs, and the reconciler that re-drives anything stuck and repairs drift."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from sqlalchemy import exists, func, or_, select
from sqlalchemy.orm import Session

from app import names
from app.adapters.jobdefs import cached_bundle_jobs, discard, prepared_jobs, sweep_prepared
from app.adapters.nvflare.base import AdminClient, RunState, ServerState
from app.db import unit_of_work
from app.errors import DispatcherError, MisconfigurationError, NvflareJobNotFound, TransientError
from app.runtime import Runtime
from app.usecases import heartbeat, prewarm, services
from app.usecases.abort import (
    RUN_OUTCOMES,
    expire_abort,
    expire_stray_runs,
    run_is_over,
    run_outcome,
    settle_stray_runs,
)
from app.usecases.dispatch import abandon_dispatch, requeue_after_transient, submit_try_s
from app.usecases.scaling import kick, net_misconfigured, scale_net, stop_net, take_down
from models import (
    ACTIVE_JOB_STATES,
    TERMINAL_JOB_STATES,
    Job,
    JobState,
    Net,
    NetState,
    ReasonCode,
    StrayRun,
)

log = logging.getLogger(__name__)


@contextmanager
def _isolated(rt: Runtime, loop: str, net_name: str) -> Iterator[None]:
    """One net's failure in a housekeeping loop is logged (one ERROR line with the net and
    the loop) and recorded on that net (`last_error`, shown by /fl/status and the CLI), never
    allowed to stop the loop for the others."""
    try:
        yield
    except Exception as exc:
        log.exception("housekeeping failed for one net", extra={"net": net_name, "loop": loop})
        try:
            with unit_of_work(rt.sessions) as session:
                net = session.get(Net, net_name)
                if net is not None:
                    net.last_error = f"{loop}: {type(exc).__name__}: {exc}"[:2000]
        except Exception:
            log.exception("recording a net's failure failed", extra={"net": net_name})


def scale_down_idle_nets(rt: Runtime) -> list[str]:
    """READY nets with no active job and no QUEUED job that could run there, idle past their
    grace, go STOPPING -> driver 0 -> STOPPED. The net row is locked like assign_next_job
    locks it, so a job claimed at the same moment is never stranded on a vanishing server."""
    stopped = []
    prewarm.settle_prewarms(rt)  # prewarm hook: how holds ended; nets a live hold wants up
    now = rt.clock()
    # One read finds the candidates (READY nets idle past their grace): the cost follows the
    # nets that are up, not the declared fleet; each candidate is then re-checked under its
    # row lock, which recomputes the idle time from the row (so a wrong column read here
    # cannot be seen: the columns are not mutated).
    with rt.sessions() as session:
        ready = session.execute(
            select(Net.name, Net.idle_since, Net.state_changed_at).where(  # pragma: no mutate
                Net.state == NetState.READY
            )
        ).all()
    candidates = [
        name
        for name, idle_since, changed_at in ready
        if rt.settings.has_net(name)
        and rt.settings.net(name).scales_to_zero
        and (now - (idle_since or changed_at)).total_seconds()
        >= rt.settings.net(name).idle_timeout_s
    ]
    for name in candidates:
        with _isolated(rt, "scale_down_idle_nets", name):
            if _scale_down_if_idle(rt, name, now):
                stopped.append(name)
    if stopped:
        kick(rt)  # a job that arrived while the net was stopping gets a fresh scale-up
    return stopped


def _scale_down_if_idle(rt: Runtime, name: str, now: datetime) -> bool:
    idle_timeout_s = rt.settings.net(name).idle_timeout_s
    with unit_of_work(rt.sessions) as session:
        # Re-checked under the lock: another worker may have used the net since the
        # candidate read (tests/unit/test_idle_scale_down.py stages that).
        net = session.scalar(
            select(Net)
            .where(Net.name == name, Net.state == NetState.READY)
            .with_for_update(skip_locked=True)
        )
        if net is None:
            return False
        idle_since = net.idle_since or net.state_changed_at
        # prewarm hook: a live hold defers the grace; an ended one starts it at its end
        idle_since = prewarm.idle_start(session, name, idle_since)
        idle_s = (now - idle_since).total_seconds()
        if idle_s < idle_timeout_s:
            return False
        # Only a job that could be claimed keeps the server: one waiting for its stray run
        # to be settled (on another net, maybe one an operator must see to) cannot run here.
        active = exists().where(Job.net_name == name, Job.state.in_(ACTIVE_JOB_STATES))
        if session.scalar(select(active)) or services.queued_job_fits(session, rt.settings, name):
            return False
        net.transition(NetState.STOPPING, now, f"idle for {idle_s:.0f}s")
    stop_net(rt, name, "idle grace passed")
    return True


def keep_alive_busy_nets(rt: Runtime) -> list[str]:
    """Ping only BUSY nets (refreshes the admin session); stopped and idle nets are left
    alone, so a scaled-to-zero server is never contacted."""
    with rt.sessions() as session:
        busy = list(session.scalars(select(Net.name).where(Net.state == NetState.BUSY)))

    def ping(name: str) -> bool:
        with _isolated(rt, "keep_alive_busy_nets", name):
            try:
                rt.admin(name).ping()
                return True
            except DispatcherError as exc:
                # Monitor decides what an unreachable or misconfigured BUSY net means.
                log.warning("keep-alive failed", extra={"net": name, "reason": str(exc)})
        return False

    calls = {name: partial(ping, name) for name in busy if rt.settings.has_net(name)}
    # The round's deadline only shows with a server that hangs (test_parallel_housekeeping,
    # left out of mutation runs as it waits the deadline out): not mutated.
    results = rt.fan_out.run(calls, _round_deadline_s(rt))  # pragma: no mutate
    return sorted(name for name, result in results.items() if result.value is True)


def _round_deadline_s(rt: Runtime) -> float:
    # Each net is talked to on its own (in parallel in a worker): one hung server costs the
    # round one command timeout, not one per net. A net still busy past this is reported
    # and left to finish in the background (at most one call per net at a time).
    return rt.settings.admin_command_timeout_s + 2.0  # pragma: no mutate (the margin's size)


@dataclass(frozen=True)
class Watched:
    """A running job as monitor sees it."""

    job_id: uuid.UUID
    state: JobState
    net_name: str
    nvflare_job_id: str
    server_start_time: float | None
    dispatched_at: datetime | None = None
    unreachable: bool = False  # the net had a monitor failure pending (unreachable_since)


STALE = "job moved on since this round read it; nothing done"


def _watched_state(session: Session, job: Watched) -> JobState | None:
    """The job's state now (row locked) if it still has the run this round watched, else
    None. A round's snapshot can be seconds old when it acts (a call to a dead server waits
    its timeout, and rounds overlap); by then the job may have been settled and even be on
    its next attempt, which a verdict about the old run must never touch."""
    row = services.get_job(session, job.job_id, lock=True)
    watching = (JobState.RUNNING, JobState.ABORTING)
    if row.state in watching and row.nvflare_job_id == job.nvflare_job_id:
        return row.state
    return None


def monitor_running_jobs(rt: Runtime) -> dict[str, str]:
    """Poll NVFLARE for every RUNNING/ABORTING job and settle the finished ones; a server
    that restarted under a job, or is gone past the grace, resolves it by LOST_JOB_POLICY.
    Each net is watched on its own: one net's failure never stops the others'."""
    watched = _watched(rt, awaited_only=False)  # pragma: no mutate (None is as false)
    outcomes = _expire_report_waits(rt)
    return outcomes | _monitor(rt, watched)


def monitor_awaited_runs(rt: Runtime) -> dict[str, str]:
    """Monitor, every QUEUED_POLL_S, only the runs of nets a QUEUED job waits for, so that job
    starts within seconds of the run before it ending, not up to a whole
    HOUSEKEEPING_INTERVAL_S later. A net whose server is not answering is left to the full
    round: a dead server is not called every second."""
    return _monitor(rt, _watched(rt, awaited_only=True))


def _watched(rt: Runtime, *, awaited_only: bool) -> list[Watched]:
    """The runs to watch: every RUNNING/ABORTING job with a run on the server, or only those
    on answering nets some QUEUED job could take."""
    stmt = (
        select(
            Job.id,
            Job.state,
            Job.net_name,
            Job.nvflare_job_id,
            Net.server_start_time,
            Job.dispatched_at,
            Net.unreachable_since,
        )
        .join(Net, Net.name == Job.net_name)
        .where(
            Job.state.in_((JobState.RUNNING, JobState.ABORTING)),
            # Not mutated, nor the filter below: each says what the other does (the one
            # below narrows the types for mypy).
            Job.nvflare_job_id.is_not(None),  # pragma: no mutate
        )
    )
    if awaited_only:
        stmt = stmt.where(Net.unreachable_since.is_(None), services.wanted_by_queued_job(Net.name))
    with rt.sessions() as session:
        rows = session.execute(stmt).all()
    return [
        Watched(job_id, state, net_name, nvflare_job_id, start, dispatched_at, since is not None)
        for job_id, state, net_name, nvflare_job_id, start, dispatched_at, since in rows
        if net_name is not None and nvflare_job_id is not None  # pragma: no mutate
    ]


def _monitor(rt: Runtime, watched: list[Watched]) -> dict[str, str]:
    """Watch these runs, each net on its own and in parallel (see _round_deadline_s)."""

    def watch(net_name: str) -> dict[str, str]:
        jobs = [w for w in watched if w.net_name == net_name]
        with _isolated(rt, "monitor_running_jobs", net_name):
            return _monitor_net(rt, net_name, jobs)
        return {str(j.job_id): "monitor failed (see the net's last_error)" for j in jobs}

    outcomes: dict[str, str] = {}
    nets = sorted({w.net_name for w in watched if rt.settings.has_net(w.net_name)})
    results = rt.fan_out.run({n: partial(watch, n) for n in nets}, _round_deadline_s(rt))
    for net_name in nets:
        result = results[net_name]
        if result.error is not None:
            for job in (w for w in watched if w.net_name == net_name):
                outcomes[str(job.job_id)] = f"not watched this round: {result.error}"
        else:
            outcomes |= result.value
    return outcomes


def _expire_report_waits(rt: Runtime) -> dict[str, str]:
    """FINISHING jobs whose results report never came within their net's report timeout
    (`report_timeout_s`, else REPORT_TIMEOUT_S): settled per REPORT_TIMEOUT_OUTCOME, so a
    lost report cannot hold a server up forever."""
    now = rt.clock()
    settings = rt.settings
    shortest = min(
        [settings.report_timeout_s] + [settings.report_timeout_for(n.name) for n in settings.nets]
    )
    with rt.sessions() as session:
        # The shortest timeout bounds the read; each job is then held to its own net's.
        candidates = session.execute(
            select(Job.id, Job.state_changed_at, Job.net_name).where(
                Job.state == JobState.FINISHING,
                Job.state_changed_at < now - timedelta(seconds=shortest),
            )
        )
        overdue = [
            (job_id, since)
            for job_id, since, net_name in candidates
            if since < now - timedelta(seconds=settings.report_timeout_for(net_name))
        ]
    outcome = (
        JobState.COMPLETED if rt.settings.report_timeout_outcome == "completed" else JobState.FAILED
    )
    results = {}
    for job_id, since in overdue:
        with unit_of_work(rt.sessions) as session:
            services.expire_report_wait(
                session, job_id, outcome, (now - since).total_seconds(), now
            )
        results[str(job_id)] = f"report timeout: {outcome}"
    if results:
        kick(rt)
    return results


def _monitor_net(rt: Runtime, net_name: str, jobs: list[Watched]) -> dict[str, str]:
    admin = rt.admin(net_name)
    now = rt.clock()
    try:
        start_time = admin.server_start_time()
    except DispatcherError as exc:
        # Unreachable, misconfigured (an admin certificate that expired) or an error nobody
        # classified: the runs cannot be watched. Past the grace they are lost; a net whose
        # admin access is misconfigured is then taken out of service (its server down).
        # But a run the server still reports finished is finished, whatever its start time:
        # settled as such, never taken for lost and run again.
        finished = {} if isinstance(exc, MisconfigurationError) else _finished(rt, admin, jobs, now)
        rest = [j for j in jobs if str(j.job_id) not in finished]
        return finished | (_unwatchable(rt, net_name, rest, exc, now) if rest else {})

    results: dict[str, str] = {}
    for job in jobs:
        if job.server_start_time is not None and start_time != job.server_start_time:
            # NVFLARE 2.9.0 keeps a killed run "RUNNING" forever after a restart (abort and
            # delete both refuse it), so the restart itself decides the job's fate.
            results[str(job.job_id)] = _lost(rt, job, "server restarted under the job")
            continue  # pragma: no mutate (`break` is the same: a net runs one job at a time)
        results[str(job.job_id)] = _watch_run(rt, admin, job, now)
    if not any(j.unreachable or j.server_start_time is None for j in jobs):
        return results  # nothing to write: a healthy busy net costs no transaction
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, net_name, lock=True)
        net.unreachable_since = None
        if net.server_start_time is None:
            # The start time was unknown at dispatch: learn it now, or a later restart
            # under the job would never be seen.
            net.server_start_time = start_time
    return results


def _finished(
    rt: Runtime, admin: AdminClient, jobs: list[Watched], now: datetime
) -> dict[str, str]:
    """The verdicts of the runs the server reports finished (the others are left out)."""
    verdicts = {}
    for job in jobs:
        try:
            state = admin.job_status(job.nvflare_job_id).state
        except DispatcherError:
            continue
        if state in RUN_OUTCOMES:
            verdicts[str(job.job_id)] = _watch_run(rt, admin, job, now)
    return verdicts


def _watch_run(rt: Runtime, admin: AdminClient, job: Watched, now: datetime) -> str:
    try:
        status = admin.job_status(job.nvflare_job_id)
    except NvflareJobNotFound:
        return _lost(rt, job, "the server does not know the run")
    except DispatcherError as exc:
        # Unknown status: the run-time limit still applies, or a job whose status can
        # never be read would keep its server up forever.
        if _overran(rt, job, now):
            return _stop_overrun(rt, job, f"status unknown: {exc}")
        return f"status unknown: {exc}"
    if status.state in RUN_OUTCOMES:
        holds = rt.settings.net(job.net_name).holds_for_report(rt.settings.release_after)
        with unit_of_work(rt.sessions) as session:
            # The verdict follows the job's state now, under its lock, not the round's read:
            # the job may have been aborted since.
            state = _watched_state(session, job)
            if state is None:
                return STALE
            outcome, detail, code = run_outcome(status.state, status.detail, state, holds)
            if code is None:
                services.hold_for_report(session, job.job_id, detail, rt.clock())
            else:
                services.finish_job(session, job.job_id, outcome, detail, rt.clock(), code=code)
            hold = code is None
        if hold:
            return "finishing: waiting for flip-api's results report"
        kick(rt)
        return str(status.state)
    if status.state == RunState.LOST:
        return _lost(rt, job, status.detail)
    if _overran(rt, job, now):
        return _stop_overrun(rt, job, status.detail)
    return str(status.state)


def _unwatchable(
    rt: Runtime, net_name: str, jobs: list[Watched], exc: DispatcherError, now: datetime
) -> dict[str, str]:
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, net_name, lock=True)
        if net.unreachable_since is None:
            net.unreachable_since = now
        net.last_error = f"monitor: {exc}"[:2000]  # pragma: no mutate (a bound; any will do)
        gone_s = (now - net.unreachable_since).total_seconds()
    if gone_s < rt.settings.server_lost_grace_s:
        return {str(j.job_id): f"server not answering for {gone_s:.0f}s: {exc}" for j in jobs}
    results = {
        str(j.job_id): _lost(rt, j, f"server not answering for {gone_s:.0f}s: {exc}") for j in jobs
    }
    if isinstance(exc, MisconfigurationError):
        net_misconfigured(rt, net_name, None, f"admin access failed on a busy net: {exc}")
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
    whose clients crashed at start stays RUNNING in 2.9.0) must not keep a server up forever.
    An abort that cannot be confirmed leaves the run as a stray run (see abort.py)."""
    try:
        outcome = str(rt.admin(job.net_name).abort(job.nvflare_job_id).outcome)
    except DispatcherError as exc:
        outcome = f"not confirmed: {exc}"
    # One rule with abort_on_server: over only when the server, answering now, says so (an
    # accepted abort takes a moment; "nothing to abort" also covers a blip).
    confirmed = run_is_over(rt, job.net_name, job.nvflare_job_id)
    reason = f"exceeded the maximum run time ({status}); abort: {outcome}"
    with unit_of_work(rt.sessions) as session:
        if _watched_state(session, job) is None:
            return STALE
        if not confirmed:
            services.add_stray_run(
                session,
                net_name=job.net_name,
                job_id=job.job_id,
                nvflare_job_id=job.nvflare_job_id,
                submit_token=None,
                reason=reason,
                now=rt.clock(),
            )
        services.finish_job(
            session, job.job_id, JobState.FAILED, reason, rt.clock(), code=ReasonCode.OVERRAN
        )
    log.error("run overran", extra={"job": str(job.job_id), "net": job.net_name, "reason": reason})
    if not confirmed and rt.settings.net(job.net_name).scales_to_zero:
        take_down(rt, job.net_name, f"overrun of job {job.job_id} could not be aborted")
    kick(rt)
    return "failed: overran"


def _lost(rt: Runtime, job: Watched, reason: str) -> str:
    """A run whose server was lost: requeue or fail per LOST_JOB_POLICY; an ABORTING job
    is simply ABORTED (the user wanted it stopped and it is). A run that may still be alive
    (a server only the admin side could not reach) is recorded as a stray run and, on a
    scale-to-zero net, dies with its server before the job can run anywhere again."""
    still_there = not reason.startswith("server restarted")
    with unit_of_work(rt.sessions) as session:
        state = _watched_state(session, job)
        if state is None:
            return STALE
        if still_there:
            services.add_stray_run(
                session,
                net_name=job.net_name,
                job_id=job.job_id,
                nvflare_job_id=job.nvflare_job_id,
                submit_token=None,
                reason=reason,
                now=rt.clock(),
            )
        if state == JobState.ABORTING:
            services.finish_job(
                session, job.job_id, JobState.ABORTED, reason, rt.clock(), code=ReasonCode.ABORTED
            )
            outcome = "aborted"
        elif rt.settings.lost_job_policy == "requeue":
            outcome = (
                "requeued"
                if services.requeue_job(session, job.job_id, reason, rt.clock())
                else "failed"
            )
        else:
            services.finish_job(
                session,
                job.job_id,
                JobState.FAILED,
                reason,
                rt.clock(),
                code=ReasonCode.SERVER_LOST,
            )
            outcome = "failed"
    log.warning(
        "run lost",
        extra={"job": str(job.job_id), "net": job.net_name, "reason": reason, "outcome": outcome},
    )
    if still_there and rt.settings.net(job.net_name).scales_to_zero:
        take_down(rt, job.net_name, f"run of job {job.job_id} lost: {reason}")
    kick(rt)
    return outcome


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
    with unit_of_work(rt.sessions) as session:
        services.ensure_net_rows(session, rt.settings, now)
        services.note_declared(session, rt.settings, now)
    redriven = _settle_undeclared(rt) + _redrive_stuck_jobs(rt, now)
    _sweep_prepared(rt)
    _discard_finished_bundles(rt)
    rows = _net_rows(rt)  # one read for the fleet; each net's decision re-checks under lock
    repaired = []
    for net_config in rt.settings.nets:
        note = ""  # pragma: no mutate (None reads as "no note" as well)
        row = rows.get(net_config.name)
        if row is None:
            continue  # pragma: no mutate (never: ensure_net_rows just made every row)
        with _isolated(rt, "reconcile", net_config.name):
            try:
                note = (
                    _watch_always_on(rt, net_config.name, row)
                    if net_config.always_on
                    else _repair_scaling_net(rt, net_config.name, row)
                )
                if row.strays:  # (a net read without strays would read none to settle)
                    left = settle_stray_runs(rt, net_config.name)
                    if left:
                        taken_down = expire_stray_runs(rt, net_config.name)
                        note = (note + "; " if note else "") + f"{left} stray run(s) unsettled"
                        note += "; net taken down" if taken_down else ""
            except MisconfigurationError as exc:
                note = _misconfigured(rt, net_config.name, row, exc)
            except TransientError as exc:
                note = f"not checked: {exc}"
        if note:
            repaired.append(f"{net_config.name}: {note}")
    kick(rt)
    with unit_of_work(rt.sessions) as session:
        heartbeat.record_run(session, heartbeat.RECONCILE, rt.clock())
    return Reconciled(tuple(redriven), tuple(repaired))


def undeclared_reason(net_name: str) -> str:
    """Why work on a net that NETS no longer declares was settled."""
    return (
        f"net {net_name} is no longer declared (NETS): its server is no longer watched "
        "or scaled; stop it by hand if it still runs"
    )


def _settle_undeclared(rt: Runtime) -> list[str]:
    """Settle the work left on nets a redeploy removed from NETS: nothing here can reach
    their servers any more. A job only claimed there goes back to the queue (its attempt
    kept); a job that may have a run there, or whose earlier run may still be there (a
    stray), FAILS with the reason: running it elsewhere could make a second live run; its run
    is kept as a stray (a net declared again takes no job beside it). An ABORTING job is
    ABORTED; a FINISHING one is left to flip-api's report or its timeout
    (its run is over). A QUEUED job pinned to such a net fails: it can never run.

    A net counts as removed only once no process has declared it for a while
    (`services.undeclared_nets`): a worker still on the previous NETS during a rolling deploy
    never settles the jobs of a net just added."""
    with rt.sessions() as session:
        removed = services.undeclared_nets(session, rt.settings, rt.clock())
        if not removed:
            return []
        jobs = session.execute(
            select(Job.id, Job.state, Job.net_name, Job.requested_net).where(
                or_(
                    Job.state.in_(ACTIVE_JOB_STATES) & Job.net_name.in_(removed),
                    (Job.state == JobState.QUEUED) & Job.requested_net.in_(removed),
                )
            )
        ).all()
        strays = session.execute(
            select(StrayRun.id, StrayRun.job_id, StrayRun.net_name).where(
                StrayRun.net_name.in_(removed)
            )
        ).all()
    settled = []
    for job_id, _state, net_name, requested in jobs:
        with _isolated(rt, "reconcile", net_name or requested or "-"):
            note = _settle_undeclared_job(rt, job_id, removed)
            if note:
                settled.append(f"{job_id}: {note}")
    for _stray_id, job_id, net_name in strays:
        # The stray itself is kept: should the net be declared again, it takes no job until
        # that run is settled. Only a QUEUED job waiting on it is ended.
        with _isolated(rt, "reconcile", net_name):
            with unit_of_work(rt.sessions) as session:
                job = services.get_job(session, job_id, lock=True)
                if job.state != JobState.QUEUED:
                    continue
                services.finish_job(
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
    return settled


def _settle_undeclared_job(rt: Runtime, job_id: uuid.UUID, removed: list[str]) -> str:
    with unit_of_work(rt.sessions) as session:
        job = services.get_job(session, job_id, lock=True)
        net_name = job.net_name if job.state in ACTIVE_JOB_STATES else job.requested_net
        if net_name is None or net_name not in removed:
            return ""  # pragma: no mutate (the job moved on since the read)
        reason = undeclared_reason(net_name)
        if job.state == JobState.ASSIGNED:
            services.requeue_job(session, job_id, reason, rt.clock(), count_attempt=False)
            if job.requested_net == net_name:
                services.finish_job(
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
        services.add_stray_run(
            session,
            net_name=net_name,
            job_id=job_id,
            nvflare_job_id=job.nvflare_job_id,
            submit_token=job.submit_token,
            reason=reason,
            now=rt.clock(),
        )
        services.finish_job(
            session, job_id, outcome, reason, rt.clock(), code=ReasonCode.NET_REMOVED
        )
    log.error("job on an undeclared net settled", extra={"job": str(job_id), "net": net_name})
    return f"{outcome.lower()}: on undeclared net {net_name}"


def _misconfigured(rt: Runtime, name: str, row: _NetRow, exc: MisconfigurationError) -> str:
    """Take a net reconcile found misconfigured out of service. A job only claimed onto it
    (ASSIGNED) goes back to the queue with it, never left on a net a restart resets to
    STOPPED; a job past that point is its chain's or the monitor's to settle first."""
    if _net_state(rt, name) == NetState.MISCONFIGURED:
        return f"misconfigured: {exc}"
    if row.job_id is not None and row.job_state != JobState.ASSIGNED:
        return f"misconfigured: {exc} (left to job {row.job_id}, {row.job_state})"
    bound = (JobState.ASSIGNED, row.attempt)
    if not net_misconfigured(rt, name, row.job_id, str(exc), attempt=bound):
        return f"misconfigured: {exc} (job {row.job_id} moved on: left to it)"
    return f"misconfigured: {exc}"


@dataclass(frozen=True)
class _NetRow:
    """A net as one reconcile round read it (decisions re-check under the row lock)."""

    state: NetState
    changed_at: datetime
    job_id: uuid.UUID | None = None
    job_state: JobState | None = None
    attempt: int = 0
    strays: int = 0


def _net_rows(rt: Runtime) -> dict[str, _NetRow]:
    """Every net with its active job and stray-run count, in three statements whatever the
    size of the fleet (not three per net)."""
    with rt.sessions() as session:
        nets = session.execute(select(Net.name, Net.state, Net.state_changed_at)).all()
        active = {
            net_name: (job_id, state, attempts)
            for job_id, net_name, state, attempts in session.execute(
                select(Job.id, Job.net_name, Job.state, Job.attempts).where(
                    # An active job always has a net (its claim set it): this only says so.
                    Job.state.in_(ACTIVE_JOB_STATES),
                    Job.net_name.is_not(None),  # pragma: no mutate
                )
            )
        }
        strays = {
            net_name: int(count)
            for net_name, count in session.execute(
                select(StrayRun.net_name, func.count()).group_by(StrayRun.net_name)
            )
        }
    rows = {}
    for name, state, changed_at in nets:
        # Not mutated: the attempt is read only with a job, and None strays read as none.
        job_id, job_state, attempt = active.get(name, (None, None, 0))  # pragma: no mutate
        count = strays.get(name, 0)  # pragma: no mutate
        rows[name] = _NetRow(state, changed_at, job_id, job_state, attempt, count)
    return rows


def _sweep_prepared(rt: Runtime) -> None:
    """Remove the prepared copies of jobs that ended (or no longer exist): those never run
    again, so no submit can be racing the removal."""
    try:
        prepared = prepared_jobs(rt.settings)
        ids = {uuid.UUID(name) for name in prepared if _is_uuid(name)}
        with rt.sessions() as session:
            live = {
                str(job_id)
                for job_id in session.scalars(
                    select(Job.id).where(Job.id.in_(ids), Job.state.not_in(TERMINAL_JOB_STATES))
                )
            }
        sweep_prepared(rt.settings, prepared - live)
    except OSError as exc:
        log.warning("removing prepared job copies failed", extra={"reason": str(exc)})


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
        with rt.sessions() as session:
            # Not mutated: without the id filter `live` holds every live job and `cached - live`
            # is the same; the filter only keeps the query small.
            query = select(Job.id).where(
                Job.id.in_(cached),  # pragma: no mutate
                Job.state.not_in(TERMINAL_JOB_STATES),
            )
            live = set(session.scalars(query))
        finished = sorted(cached - live)
        for job_id in finished:
            discard(rt.settings, job_id)
    except OSError as exc:
        # A full or read-only data folder must not stop the rest of reconcile.
        log.warning("removing cached S3 bundles failed", extra={"reason": str(exc)})
        return []
    if finished:
        log.info("cached S3 bundles removed", extra={"jobs": [str(j) for j in finished]})
    return finished


def _net_state(rt: Runtime, name: str) -> NetState:
    with rt.sessions() as session:
        return services.get_net(session, name).state


def _retry_budget_s(rt: Runtime) -> float:
    # How long a submit's own tries may go on: every retry's wait and every try's own time
    # (a login and the submit command), not only the waits.
    settings = rt.settings
    return float(settings.retry_max * (settings.retry_backoff_max_s + submit_try_s(settings)))


def _submit_holder_gone(due_at: datetime | None, now: datetime) -> bool:
    """No worker holds the DISPATCHING job's submit any more: the time by which its holder
    (a try, or a retry it announced) had to be heard of again is past. A row from before
    the lease existed has none: its holder is taken as gone."""
    return due_at is None or now > due_at


def _lease_resent_submit(rt: Runtime, job_id: uuid.UUID) -> None:
    """The re-sent submit holds the job now: it has until its own try would end (plus the
    time to reach a worker) before it, in turn, counts as gone."""
    with unit_of_work(rt.sessions) as session:
        job = services.get_job(session, job_id, lock=True)
        if job.state == JobState.DISPATCHING:
            wait_s = rt.settings.housekeeping_interval_s + submit_try_s(rt.settings)
            job.step_due_at = rt.clock() + timedelta(seconds=wait_s)


def _redrive_stuck_jobs(rt: Runtime, now: datetime) -> list[str]:
    stuck_s = rt.settings.stuck_after_s
    redriven = []
    with rt.sessions() as session:
        jobs = session.execute(
            select(
                Job.id, Job.state, Job.net_name, Job.state_changed_at, Job.attempts, Job.step_due_at
            ).where(Job.state.in_((JobState.ASSIGNED, JobState.DISPATCHING, JobState.ABORTING)))
        ).all()
    for job_id, state, net_name, changed_at, attempt, due_at in jobs:
        age_s = (now - changed_at).total_seconds()
        known = rt.settings.has_net(net_name)
        with _isolated(rt, "reconcile", net_name or "-"):  # pragma: no mutate (no such net row)
            if state == JobState.ASSIGNED:
                # The chain itself gives up at the readiness deadline; past that plus the
                # stuck margin, the chain is gone (lost message, dead worker): requeue.
                # `or ""` never applies (a known net has a name; it is there for mypy), so
                # that line is not mutated.
                ready_timeout_s = (
                    rt.settings.net(net_name or "").ready_timeout_s  # pragma: no mutate
                    if known
                    else 0.0
                )
                if age_s > ready_timeout_s + stuck_s:
                    requeue_after_transient(
                        rt,
                        job_id,
                        f"stuck in ASSIGNED for {age_s:.0f}s",
                        net_name=net_name,
                        attempt=attempt,
                    )
                    redriven.append(f"{job_id}: requeued")
            elif state == JobState.DISPATCHING:
                if not _submit_holder_gone(due_at, now):
                    continue  # a worker still holds the submit: its own retries go on
                if age_s > _retry_budget_s(rt) + stuck_s:
                    abandon_dispatch(rt, job_id, f"submit outcome unknown for {age_s:.0f}s")
                    redriven.append(f"{job_id}: dispatch abandoned, token settled")
                elif known:
                    # Its worker is gone (killed, or its retry message lost): re-sent at
                    # once with the same stored token, which adopts the run if the first
                    # submit landed.
                    _lease_resent_submit(rt, job_id)
                    rt.outbox.send(
                        names.DISPATCH, job_id=str(job_id), net_name=net_name, attempt=attempt
                    )
                    redriven.append(f"{job_id}: dispatch re-sent")
            elif state == JobState.ABORTING:
                if age_s > rt.settings.abort_timeout_s:
                    expire_abort(rt, job_id)
                    redriven.append(f"{job_id}: abort expired")
                elif age_s > stuck_s:
                    rt.outbox.send(names.ABORT_ON_SERVER, job_id=str(job_id))
                    redriven.append(f"{job_id}: abort re-sent")
    return redriven


def _set_net_state(
    rt: Runtime,
    name: str,
    expected: NetState,
    target: NetState,
    reason: str,
    *,
    require_idle: bool = False,
) -> bool:
    """Move a net only if it is still in `expected` (and, with `require_idle`, still has no
    active job), checked under the row lock assignment takes."""
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, name, lock=True)
        if net.state != expected:
            return False
        if require_idle and services.active_job(session, name) is not None:
            return False
        if target == NetState.READY:
            net.transition(NetState.READY, rt.clock(), reason)
            net.idle_since = rt.clock()
        else:
            net.transition(target, rt.clock(), reason)
        return True


def _repair_scaling_net(rt: Runtime, name: str, row: _NetRow) -> str:  # noqa: PLR0912
    state, changed_at = row.state, row.changed_at
    job_state, job_id, attempt = row.job_state, row.job_id, row.attempt
    now = rt.clock()
    age_s = (now - changed_at).total_seconds()
    if state == NetState.BUSY:
        return ""  # monitor owns busy nets
    if job_id is not None:
        if state == NetState.STARTING and job_state == JobState.ASSIGNED:
            return _redrive_lost_scale_up(rt, name, job_id, attempt, age_s)
        return ""
    observation = rt.driver(name).observe()
    up = observation.running > 0 or observation.pending > 0 or observation.desired > 0
    if state == NetState.MISCONFIGURED:
        # A misconfigured net must not keep a server running (a failed scale-down earlier).
        if up and _still(rt, name, state):
            stop_net(rt, name, "misconfigured net still had a server")
            return "MISCONFIGURED net had a server; scaled to 0"
        return ""
    if state == NetState.STOPPED and not up and row.strays:
        # The server is confirmed at zero replicas: whatever it ran died with it.
        with unit_of_work(rt.sessions) as session:
            services.clear_stray_runs(session, name)
        return "STOPPED at zero replicas: stray runs gone with the server"
    if state in (NetState.STOPPING, NetState.UNHEALTHY):
        # Decided on the round's read: re-checked under the lock, so a net that was stopped
        # and claimed since (STARTING, its job's server coming up) keeps its replica.
        if not _still(rt, name, state):
            return ""
        stop_net(rt, name, f"settling {state}")
        return f"{state}: scale-down re-driven"
    if state == NetState.OUTAGE:
        # PER_JOB_FL_SERVER was turned on across a redeploy: a former always-on net.
        target = NetState.READY if observation.is_up else NetState.STOPPED
        _set_net_state(rt, name, NetState.OUTAGE, target, "now scales to zero")
        return f"OUTAGE -> {target} (net scales to zero now)"
    if state == NetState.STARTING:
        # Its job went away (aborted, requeued) while the server came up.
        if observation.is_up:
            _set_net_state(rt, name, NetState.STARTING, NetState.READY, "up, no job: idle")
            return "STARTING without a job: now READY (idle)"
        if age_s > rt.settings.net(name).ready_timeout_s and _set_net_state(
            rt, name, NetState.STARTING, NetState.STOPPING, "start abandoned", require_idle=True
        ):
            stop_net(rt, name, "start abandoned")
            return "STARTING without a job past the deadline: stopped"
        return ""
    if state == NetState.STOPPED and up and age_s > rt.settings.stuck_after_s:
        # Drift: a server runs that nobody uses (e.g. a crash between scale and commit).
        # STOPPING first, under the lock and only if still idle: no job can be claimed onto
        # the net while its server is being taken away.
        # require_idle is not mutated: a claim moves a STOPPED net to STARTING in its own
        # transaction, so the expected state already refuses a net claimed meanwhile
        # (test_a_drifted_server_is_left_to_a_job_claimed_meanwhile stages it).
        if _set_net_state(
            rt,
            name,
            NetState.STOPPED,
            NetState.STOPPING,
            "drift: server up",
            require_idle=True,  # pragma: no mutate (see above)
        ):
            stop_net(rt, name, "drift: server up while STOPPED")
            return "drift: STOPPED net had a server; scaled to 0"
        return ""
    if state == NetState.READY and not up:
        if _set_net_state(
            rt, name, NetState.READY, NetState.STOPPED, "drift: server gone", require_idle=True
        ):
            return "drift: READY net had no server; now STOPPED"
        return ""  # a job was claimed onto the warm net meanwhile: its chain scales it up
    return ""


def _still(rt: Runtime, name: str, state: NetState) -> bool:
    """The net is still in `state` with no active job, read under the row lock claims take.
    None of these states is one a claim takes a net from, so the answer holds until the
    scale-down that follows."""
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, name, lock=True)
        return net.state == state and services.active_job(session, name) is None


def _redrive_lost_scale_up(
    rt: Runtime, name: str, job_id: uuid.UUID, attempt: int, age_s: float
) -> str:
    """A STARTING net whose job is still ASSIGNED but whose driver was never asked for a
    replica lost its chain before scale_up ran (a lost message, a dead worker): start it
    again. Every step is idempotent, so a chain that was merely slow does no harm."""
    if age_s <= rt.settings.stuck_after_s or rt.driver(name).observe().desired > 0:
        return ""
    rt.outbox.start_pipeline(str(job_id), name, attempt)
    return f"STARTING with no scale-up for {age_s:.0f}s: pipeline of job {job_id} re-driven"


def _watch_always_on(rt: Runtime, name: str, row: _NetRow) -> str:
    """An always-on server that cannot be reached is an OUTAGE, loudly; back again, READY.
    A net left STOPPING, UNHEALTHY or STOPPED by scale-to-zero mode (PER_JOB_FL_SERVER
    turned off across a redeploy) is brought back up: always-on means one replica."""
    state, job = row.state, row.job_id
    if state == NetState.MISCONFIGURED:
        return ""
    net_config = rt.settings.net(name)
    scalable = net_config.driver.kind != "static"
    left_down = state in (NetState.STOPPING, NetState.UNHEALTHY, NetState.STOPPED)
    if scalable and left_down and rt.driver(name).observe().desired < 1:
        scale_net(rt, name, 1, "always-on net: one replica")
    server = rt.admin(name).server_state()
    if server == ServerState.STARTED:
        left_behind = state in (
            NetState.OUTAGE,
            NetState.STOPPED,
            NetState.STOPPING,
            NetState.UNHEALTHY,
        ) or (state == NetState.STARTING and job is None)
        if left_behind:
            target = NetState.BUSY if state == NetState.OUTAGE and job else NetState.READY
            _set_net_state(rt, name, state, target, "always-on server reachable")
            if state == NetState.OUTAGE:  # pragma: no mutate (only a log line depends on it)
                log.warning("outage over", extra={"net": name})
            return f"{state} -> {target}"
        return ""
    note = ""  # pragma: no mutate (None reads as "no note" as well)
    if state not in (NetState.OUTAGE, NetState.STARTING):
        _set_net_state(rt, name, state, NetState.OUTAGE, f"always-on server {server}")
        log.error("OUTAGE: always-on server unreachable", extra={"net": name, "server": server})
        note = f"{state} -> OUTAGE"
    if scalable and row.strays and not rt.driver(name).observe().is_up:
        # Scaled to zero by hand (or crashed for good): the runs it held died with it, and a
        # job waiting on its own stray run may go elsewhere instead of waiting for an operator.
        with unit_of_work(rt.sessions) as session:
            services.clear_stray_runs(session, name)
        note = (note + "; " if note else "") + "no server: stray runs gone with it"
    return note

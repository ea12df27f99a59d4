"""Monitoring of running jobs: poll NVFLARE for every RUNNING/ABORTING job's run and settle
it (finished, held for flip-api's report, overran, or lost with its server); in the same
round, FINISHING jobs whose results report never came are expired (`report_waits`). Each net
is watched on its own."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import select

from app import traces
from app.adapters.backend import AbortOutcome, AdminClient, RunState, RunStatus
from app.db import unit_of_work
from app.errors import (
    DispatcherError,
    FilesNameAnotherServer,
    MisconfigurationError,
    NvflareJobNotFound,
)
from app.runtime import Runtime
from app.usecases import claims, records, report_waits, revived_runs
from app.usecases.abort import (
    RUN_OUTCOMES,
    RunEnd,
    over_after_abort,
    run_outcome,
    window_end,
)
from app.usecases.housekeeping import isolated, round_deadline_s
from app.usecases.lost_runs import (
    STALE,
    Watched,
    answered,
    keep_as_stray,
    lost,
    unwatchable,
    watched_state,
)
from app.usecases.scaling import kick, take_down
from app.usecases.step_leases import LEASED_COLUMNS, LEASED_STATES, Leased, redrive_lapsed_steps
from models import Job, JobState, Net, ReasonCode

log = logging.getLogger(__name__)


def monitor_running_jobs(rt: Runtime) -> dict[str, str]:
    """Poll NVFLARE for every RUNNING/ABORTING job and settle the finished ones; a server
    that restarted under a job, or is gone past the grace, resolves it by LOST_JOB_POLICY.
    Each net is watched on its own: one net's failure never stops the others'. Each round
    also re-drives the jobs whose pipeline step lost its worker (step_leases): this round
    runs every HOUSEKEEPING_INTERVAL_S, twice as often as reconcile."""
    now = rt.clock()
    # One read for the whole round (issue 37: it was three), of every job it may act on.
    with rt.sessions() as session:
        rows = session.execute(_ROUND).all()
    leased = [Leased(*row[:6]) for row in rows if row.state in LEASED_STATES]
    redriven = redrive_lapsed_steps(rt, leased, now)
    watched = _watchable(row for row in rows if row.state in WATCHED_STATES)
    finishing = [
        (row.id, row.state_changed_at, row.net_name)
        for row in rows
        if row.state == JobState.FINISHING
    ]
    outcomes = report_waits.expire_report_waits(rt, finishing, now)
    verdicts = _monitor(rt, watched)
    _stop_uncounted(rt, watched, [net for _, _, net in finishing])
    return redriven | outcomes | verdicts


def _stop_uncounted(rt: Runtime, watched: list[Watched], finishing: list[str | None]) -> None:
    """After the verdicts, on every net whose server keeps no submit token (Flower) that a
    job runs on or holds (FINISHING: waiting for its results report), or that idles up as
    always-on (`revived_runs.idle_always_on`), stop the live runs no job counts
    (`revived_runs.stop_uncounted_runs`): a defence that never holds up the round's own
    work. Each full round only, not the awaited poll's (a list of every run a SuperLink
    keeps, each second), and not on a net the round read unreachable."""
    runs: dict[str, list[str]] = {}
    for job in watched:
        if not (job.unreachable or job.verdict):
            runs.setdefault(job.net_name, []).append(job.nvflare_job_id)
    for net_name in [*finishing, *revived_runs.idle_always_on(rt)]:
        if net_name is not None:
            runs.setdefault(net_name, [])
    revived_runs.stop_uncounted_on(rt, runs)


def monitor_awaited_runs(rt: Runtime) -> dict[str, str]:
    """Monitor, every AWAITED_POLL_S, only the runs of nets a QUEUED job waits for, so that job
    starts within seconds of the run before it ending, not up to a whole
    HOUSEKEEPING_INTERVAL_S later. A net whose server is not answering is left to the full
    round: a dead server is not called every second."""
    return _monitor(rt, _watched(rt, awaited_only=True), counts=False)


WATCHED_STATES = (JobState.RUNNING, JobState.ABORTING)
# A round's one read: the leased jobs' columns first (`Leased`), then what a watch needs
# (`_watchable`), of every job the round may act on (FINISHING: its report may be overdue).
# Outer join: a leased or FINISHING job's row is wanted whatever its net (every job with a
# net has its row: jobs.net_name references nets.name).
_ROUND = (
    select(
        *LEASED_COLUMNS,
        Job.nvflare_job_id,
        Job.dispatched_at,
        Net.server_start_time,
        Net.unreachable_since,
        Job.traceparent,
        Net.misconfigured_after_job,
    )
    .outerjoin(Net, Net.name == Job.net_name)
    .where(Job.state.in_((*LEASED_STATES, *WATCHED_STATES, JobState.FINISHING)))
)
_WATCHED = (
    select(*_ROUND.selected_columns)
    .join(Net, Net.name == Job.net_name)
    .where(Job.state.in_(WATCHED_STATES))
)

_AWAITED = _WATCHED.where(Net.unreachable_since.is_(None), claims.wanted_by_queued_job(Net.name))


def _watched(rt: Runtime, *, awaited_only: bool) -> list[Watched]:
    """The runs to watch: every RUNNING/ABORTING job with a run on the server, or only those
    on answering nets some QUEUED job could take."""
    stmt = _AWAITED if awaited_only else _WATCHED
    with rt.sessions() as session:
        return _watchable(session.execute(stmt).all())


def _watchable(rows: Iterable[Sequence[Any]]) -> list[Watched]:
    """The runs of these rows (`_ROUND`'s columns) that can be watched."""
    return [
        Watched(job_id, state, net_name, run, start, at, since is not None, trace, verdict)
        for job_id, state, net_name, _, _, _, run, at, start, since, trace, verdict in rows
        # A job ABORTING before its submit landed has no run to watch yet (a job with a net
        # has its row: that test only narrows the type).
        if net_name is not None and run is not None
    ]


def _monitor(rt: Runtime, watched: list[Watched], *, counts: bool = True) -> dict[str, str]:
    """Watch these runs, each net on its own and in parallel (see round_deadline_s); a
    failure counts a round unless `counts` is off (the awaited poll's)."""
    healthy: list[str] = []  # nets read healthy that answered: no failure stays counted
    began = rt.clock()

    def watch(net_name: str) -> dict[str, str]:
        jobs = [w for w in watched if w.net_name == net_name]
        with isolated(rt, "monitor_running_jobs", net_name):
            return _monitor_net(rt, net_name, jobs, healthy, counts)
        return {str(j.job_id): "monitor failed (see the net's last_error)" for j in jobs}

    outcomes: dict[str, str] = {}
    nets = sorted({w.net_name for w in watched if rt.settings.has_net(w.net_name)})
    results = rt.fan_out.run({n: partial(watch, n) for n in nets}, round_deadline_s(rt))
    for net_name in nets:
        result = results[net_name]
        if result.error is not None:
            for job in (w for w in watched if w.net_name == net_name):
                outcomes[str(job.job_id)] = f"not watched this round: {result.error}"
        else:
            outcomes |= result.value
    if (rt.clock() - began).total_seconds() >= rt.settings.housekeeping_interval_s / 2:
        # A round as long as half a beat interval may have seen the next one count a failure
        # after its read (a quiet, quick round stays one read).
        answered(rt, healthy)
    return outcomes


def _monitor_net(
    rt: Runtime, net_name: str, jobs: list[Watched], healthy: list[str], counts: bool
) -> dict[str, str]:
    admin = rt.admin(net_name)
    now = rt.clock()
    if verdict := next((j.verdict for j in jobs if j.verdict), None):
        # A worker start found the net's files naming another server: what they reach is
        # not its server, so nothing is asked of it (its answers would settle the runs).
        return unwatchable(rt, net_name, jobs, FilesNameAnotherServer(verdict), now, counts=counts)
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
        lost_or_not = unwatchable(rt, net_name, rest, exc, now, counts=counts) if rest else {}
        return finished | lost_or_not

    # The runs stored under another start time than the one answered now: their verdicts,
    # None for a run that lives on the process answering now.
    after_restart = {
        job.job_id: _after_restart(rt, admin, job, now, start_time)
        for job in jobs
        if job.server_start_time is not None and start_time != job.server_start_time
    }
    results = {
        str(job.job_id): after_restart.get(job.job_id)
        or _watch_run(rt, admin, job, now, start_time)
        for job in jobs
    }
    # The start time stored is not that of the process a run lives on.
    stale = None in after_restart.values()
    if not (stale or any(j.unreachable or j.server_start_time is None for j in jobs)):
        if str(RunState.RUNNING) in results.values():
            healthy.append(net_name)  # (another round may have counted a failure since)
        return results  # nothing to write here: a healthy busy net costs no transaction
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, net_name, lock=True)
        net.answered()
        if net.server_start_time is None or stale:
            # Unknown at dispatch, or readiness's of an earlier process: learn it now, or
            # a later restart under the job would never be seen.
            net.server_start_time = start_time
    return results


def _after_restart(
    rt: Runtime, admin: AdminClient, job: Watched, now: datetime, start_time: float
) -> str | None:
    """The server answers with another start time than the one stored for the job's run.
    NVFLARE 2.9 keeps a run killed with its process RUNNING for ever, so its status cannot
    say it died; and the start time stored may be readiness's, of a process before the one
    the run lives on (the read after the submit failed across a restart). A run the server
    reports finished gets its verdict (its record survives the restart); one the process
    went RUNNING after this process started, or that the process lists among its live runs
    (a server clock stepped back can date a live run before its process), lives here: None,
    keep watching it. Any other is lost
    with the old process (kept as a stray all the same, settled on the server's answer to
    its abort)."""
    try:
        status = admin.job_status(job.nvflare_job_id)
        if status.state != RunState.RUNNING:
            # Finished or lost: judged on this very read, no start time to compare.
            return _verdict(rt, admin, job, now, status)
        if status.started_at is not None and not _started_before(status, start_time):
            return None
        if job.nvflare_job_id in admin.live_runs():
            return None
    except NvflareJobNotFound:
        pass  # unknown to the new process: its job store is new, the run went with the old
    except DispatcherError as exc:
        # It cannot say now (a blip, an error nobody classified): asked again next round,
        # the stored start time kept so the restart is still seen. A run that completed
        # before the restart is not taken for lost and run again; MAX_RUN_S still holds.
        if _overran(rt, job, now):
            return _stop_overrun(rt, job, f"status unknown after a restart: {exc}")
        return f"status unknown after a restart: {exc}"
    return lost(rt, job, "server restarted under the job")


def _finished(
    rt: Runtime, admin: AdminClient, jobs: list[Watched], now: datetime
) -> dict[str, str]:
    """The verdicts of the runs the server reports finished (the others are left out)."""
    return {
        str(job.job_id): _watch_run(rt, admin, job, now)
        for job in jobs
        if _reads_finished(admin, job)
    }


def _reads_finished(admin: AdminClient, job: Watched) -> bool:
    """The server reports the run finished (False when it cannot say)."""
    try:
        return admin.job_status(job.nvflare_job_id).state in RUN_OUTCOMES
    except DispatcherError:
        return False


@traces.monitor_verdict(quiet=(str(RunState.RUNNING), STALE, "status unknown"))
def _watch_run(
    rt: Runtime,
    admin: AdminClient,
    job: Watched,
    now: datetime,
    process_started: float | None = None,
) -> str:
    """One run's verdict from its status; `process_started`: the start time of the server
    process that answers now (None when it could not be read)."""
    try:
        status = admin.job_status(job.nvflare_job_id)
    except NvflareJobNotFound:
        return lost(rt, job, "the server does not know the run")
    except DispatcherError as exc:
        # Unknown status: the run-time limit still applies, or a job whose status can
        # never be read would keep its server up forever.
        if _overran(rt, job, now):
            return _stop_overrun(rt, job, f"status unknown: {exc}")
        return f"status unknown: {exc}"
    return _verdict(rt, admin, job, now, status, process_started=process_started)


def _verdict(
    rt: Runtime,
    admin: AdminClient,
    job: Watched,
    now: datetime,
    status: RunStatus,
    *,
    process_started: float | None = None,
) -> str:
    """One run's verdict from the status just read (`process_started` as for `_watch_run`:
    without it, a RUNNING run is not compared with the process that answers)."""
    if status.state in RUN_OUTCOMES:
        holds = rt.settings.net(job.net_name).holds_for_report(rt.settings.release_after)
        with unit_of_work(rt.sessions) as session:
            # The verdict follows the job's state now, under its lock, not the round's read:
            # the job may have been aborted since.
            state = watched_state(session, job)
            if state is None:
                return STALE
            outcome, detail, code = run_outcome(status.state, status.detail, state, holds)
            if status.unstarted:
                # Aborted before it started (by an abort whose answer was lost, or by hand):
                # the server's job runner may still start it.
                keep_as_stray(rt, session, job, detail, window_end(rt, RunEnd.UNSTARTED))
            if code is None:
                records.hold_for_report(session, job.job_id, detail, rt.clock())
            else:
                records.finish_job(session, job.job_id, outcome, detail, rt.clock(), code=code)
            hold = code is None
        if hold:
            return "finishing: waiting for flip-api's results report"
        kick(rt)
        return str(status.state)
    if status.state == RunState.LOST:
        return lost(rt, job, status.detail)
    if _started_before(status, process_started) and _not_listed(admin, job):
        # A re-sent submit's token adopted the record of a run killed with an earlier
        # process (it reads RUNNING for ever), with this process's start time: no restart
        # is seen, and the job would hold its server until MAX_RUN_S.
        return lost(rt, job, "server restarted under the job: its run began before this process")
    if _overran(rt, job, now):
        return _stop_overrun(rt, job, status.detail)
    return str(status.state)


def _started_before(status: RunStatus, process_started: float | None) -> bool:
    """The run went RUNNING before the server process that answers now was started: it ran
    on an earlier process and died with it (NVFLARE 2.9 never resumes a run a restart
    killed; tests/integration/test_nvflare_admin.py measures both times)."""
    return (
        status.started_at is not None
        and process_started is not None
        and status.started_at < process_started
    )


def _not_listed(admin: AdminClient, job: Watched) -> bool:
    """The answering process does not list the run among its own (check_status's job
    table); False when it cannot say. A run dated before its process by a server clock
    stepped back is still listed; a dead one never is (that table alone is no proof of
    death: a live run was missing from it once, tests/e2e/test_awaited_runs.py)."""
    try:
        return job.nvflare_job_id not in admin.live_runs()
    except DispatcherError:
        return False


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
    answer: AbortOutcome | None = None
    try:
        answer = rt.admin(job.net_name).abort(job.nvflare_job_id).outcome
        outcome = str(answer)
    except DispatcherError as exc:
        outcome = f"not confirmed: {exc}"
    # One rule with abort_on_server: over only when the server, answering now, says so (an
    # accepted abort takes a moment; "nothing to abort" also covers a blip).
    end = over_after_abort(rt, job.net_name, job.nvflare_job_id, answer)
    confirmed = end == RunEnd.OVER
    reason = f"exceeded the maximum run time ({status}); abort: {outcome}"
    with unit_of_work(rt.sessions) as session:
        if watched_state(session, job) is None:
            return STALE
        if not confirmed:
            keep_as_stray(rt, session, job, reason, window_end(rt, end))
        records.finish_job(
            session, job.job_id, JobState.FAILED, reason, rt.clock(), code=ReasonCode.OVERRAN
        )
    log.error("run overran", extra={"job": str(job.job_id), "net": job.net_name, "reason": reason})
    if not confirmed and rt.settings.net(job.net_name).scales_to_zero:
        take_down(rt, job.net_name, f"overrun of job {job.job_id} could not be aborted")
    kick(rt)
    return "failed: overran"

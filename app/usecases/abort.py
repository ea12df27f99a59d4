"""Aborting runs on a server: an ABORTING job's run, and stray runs no job counts. A server
that is down, or that does not know the run, means "nothing to abort". Aborting ends within
ABORT_TIMEOUT_S: past it the job is ABORTED anyway and a run that could not be stopped dies
with its server (scale-to-zero nets) or waits as a stray run for the server to answer."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.adapters.backend import AbortOutcome, RunState
from app.db import unit_of_work
from app.errors import DispatcherError, NvflareJobNotFound
from app.runtime import Runtime
from app.usecases import records
from app.usecases.scaling import kick, runs_revive, take_down
from app.usecases.step_leases import lapsed
from models import JobState, NetState, ReasonCode, StrayRun

log = logging.getLogger(__name__)

RUN_OUTCOMES = {
    RunState.COMPLETED: JobState.COMPLETED,
    RunState.FAILED: JobState.FAILED,
    RunState.ABORTED: JobState.ABORTED,
}


COMPLETED_BEFORE_ABORT = "run completed before the abort took effect"

# How long nvflare 2.9's job runner may still start a run after its abort was answered
# "aborted before running it": the runner deploys the job to its sites and then starts the
# server's and the sites' job processes (each step waits up to the server's admin timeout,
# 10 s by default), and then sets the run RUNNING over the FINISHED:ABORTED mark made
# meanwhile. Three such steps and a margin for a loaded host.
RUN_START_WINDOW_S = 60.0


def run_outcome(
    run: RunState, detail: str, job_state: JobState, holds_for_report: bool
) -> tuple[JobState, str, ReasonCode | None]:
    """How a job ends (or FINISHING: held for flip-api's report) once NVFLARE says its run
    finished, and the reason to record. One rule for the monitor and for an abort that
    found the run over: a completed run of a job flip-api asked to abort ends COMPLETED
    where that means "NVFLARE finished it", but ABORTED on a net that holds for results,
    where COMPLETED would mean "results uploaded" and no report will ever come. The code is
    None for FINISHING (not an end)."""
    outcome = RUN_OUTCOMES.get(run, JobState.ABORTED)
    if outcome != JobState.COMPLETED or not holds_for_report:
        return outcome, detail, _run_code(outcome, job_state)
    if job_state == JobState.RUNNING:
        return JobState.FINISHING, detail, None
    reason = f"{COMPLETED_BEFORE_ABORT} ({detail}); no results report: aborted"
    return JobState.ABORTED, reason, ReasonCode.ABORTED


def _run_code(outcome: JobState, job_state: JobState) -> ReasonCode:
    if outcome == JobState.COMPLETED:
        return ReasonCode.RUN_COMPLETED
    if outcome == JobState.FAILED:
        return ReasonCode.RUN_FAILED
    # An ABORTED run of a job being aborted is the abort it asked for.
    return ReasonCode.ABORTED if job_state == JobState.ABORTING else ReasonCode.RUN_ABORTED


def abort_on_server(rt: Runtime, job_id: uuid.UUID) -> JobState:
    """Abort an ABORTING job's run. A server that is down, or that does not know the job or
    runs it in no process, means "nothing to abort": ABORTED, net released, no error. An abort
    the server could not confirm (an error it raised) is re-sent by each reconcile round until
    ABORT_TIMEOUT_S, then settled by `expire_abort`. A submit still held by its worker sends
    the abort when it lands; one whose outcome was never learnt and that no worker holds any
    more has its run looked up by the attempt's token: found, it is aborted; not found (or
    the server not answering), the job waits for ABORT_TIMEOUT_S, since such a submit may
    still land."""
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id)
        if job.state != JobState.ABORTING:
            return job.state
        nvflare_job_id, net_name = job.nvflare_job_id, job.net_name
        token, held = job.submit_token, not lapsed(job.step_due_at, rt.clock())
    if net_name is None or (nvflare_job_id is None and (held or token is None)):
        return JobState.ABORTING  # submit in flight: dispatch() sends the abort when it lands
    if not rt.settings.has_net(net_name):
        return JobState.ABORTING  # a net a redeploy removed: reconcile settles the job
    try:
        if nvflare_job_id is None:
            # A submit whose outcome was never learnt (its reply lost), which no worker holds
            # any more: its step's retry found the job ABORTING and sent nothing. The run it
            # may have started is found by its token (before, it ran on until ABORT_TIMEOUT_S).
            nvflare_job_id = rt.admin(net_name).find_run(token or "")
            if nvflare_job_id is None:
                # Nothing yet: not proof that nothing will land (a stalled worker's submit,
                # a server still taking the upload in). The job waits for ABORT_TIMEOUT_S as
                # before, whose expiry keeps the token to look up (review 21's break-it: ended
                # "nothing to abort" here, a run landing next ran on unrecorded).
                return JobState.ABORTING
        result = rt.admin(net_name).abort(nvflare_job_id)
    except DispatcherError as exc:
        log.warning(
            "abort not confirmed; retried until ABORT_TIMEOUT_S",
            extra={"job": str(job_id), "net": net_name, "reason": str(exc)},
        )
        return JobState.ABORTING
    if result.outcome == AbortOutcome.ALREADY_FINISHED:
        return _settle_finished(rt, job_id, net_name, nvflare_job_id)
    if result.outcome == AbortOutcome.ABORTED:
        reason = "aborted on the server"
    elif result.outcome == AbortOutcome.ABORTED_BEFORE_START:
        reason = "aborted on the server before it started"
    else:
        reason = f"nothing to abort: {result.detail or result.outcome}"
    # One rule with settle_stray_runs: a run is over only when its server, answering now,
    # says so. An accepted abort takes a moment to stop the run, and "nothing to abort" also
    # covers a server that could not be reached: a blip must not leave the run going while
    # its net takes the next job. Unless the server confirms, the run is kept as a stray
    # run (aborted when it answers, or gone with its server).
    end = over_after_abort(rt, net_name, nvflare_job_id, result.outcome)
    run = (net_name, nvflare_job_id, end)
    _finish(rt, job_id, run, JobState.ABORTED, reason=reason, code=ReasonCode.ABORTED)
    return JobState.ABORTED


def _finish(
    rt: Runtime,
    job_id: uuid.UUID,
    run: tuple[str, str, RunEnd],
    state: JobState,
    *,
    reason: str,
    code: ReasonCode,
) -> None:
    """End an ABORTING job; its run (net, run id, how it ended), unless over, is kept as a
    stray run, held for its start window if UNSTARTED."""
    net_name, nvflare_job_id, end = run
    with unit_of_work(rt.sessions) as session:
        if end != RunEnd.OVER:
            records.add_stray_run(
                session,
                net_name=net_name,
                job_id=job_id,
                nvflare_job_id=nvflare_job_id,
                submit_token=stray_token(rt, session, job_id, net_name),
                reason=reason,
                now=rt.clock(),
                settle_after=window_end(rt, end),
            )
        records.finish_job(session, job_id, state, reason, rt.clock(), code=code)
    kick(rt)


def stray_token(rt: Runtime, session: Session, job_id: uuid.UUID, net_name: str) -> str | None:
    """The submit token a stray run of this job on this net keeps: on a net whose server keeps
    no token (Flower), another submit of the attempt may have started a later run of it whose
    id was never learnt, and settling the stray looks the token up, which stops that run
    (simulation seed 508; an unconfirmed abort's stray too: the break-it review of round 9);
    None elsewhere."""
    if not (rt.settings.has_net(net_name) and rt.settings.net(net_name).tokens_by_lookup):
        return None
    return records.get_job(session, job_id).submit_token


class RunEnd(StrEnum):
    """What the server, answering now, says of a run an abort was sent for."""

    GOING = "going"  # it may still run (or the server cannot say)
    OVER = "over"  # over, or unknown to the server
    # Aborted before the server's job runner started it (the abort's own answer, or
    # FINISHED:ABORTED with no start time): over only once the runner can no longer start it.
    UNSTARTED = "unstarted"


def over_after_abort(
    rt: Runtime, net_name: str, nvflare_job_id: str, outcome: AbortOutcome | None
) -> RunEnd:
    """Whether the run an abort was just sent for is over: the server said it runs it in no
    process (NVFLARE 2.9 still reads a run killed with an earlier process RUNNING, so that
    answer is the only proof such a run ever gives), or its status, read now, says so. A
    run aborted before it started is UNSTARTED, whatever its status reads."""
    if outcome == AbortOutcome.ABORTED_BEFORE_START:
        return RunEnd.UNSTARTED
    if outcome == AbortOutcome.NOT_RUNNING:
        return RunEnd.OVER
    return run_end(rt, net_name, nvflare_job_id)


def run_end(rt: Runtime, net_name: str, nvflare_job_id: str) -> RunEnd:
    """Only the server, answering now, can say a run is over (or unknown to it)."""
    try:
        status = rt.admin(net_name).job_status(nvflare_job_id)
    except NvflareJobNotFound:
        return RunEnd.OVER
    except DispatcherError:
        return RunEnd.GOING
    if status.state == RunState.RUNNING:
        return RunEnd.GOING
    return RunEnd.UNSTARTED if status.unstarted else RunEnd.OVER


def window_end(rt: Runtime, end: RunEnd) -> datetime | None:
    """Until when a stray run that ended so must be held: an UNSTARTED one for
    RUN_START_WINDOW_S from now (the job runner may still start it), any other not at all."""
    if end != RunEnd.UNSTARTED:
        return None
    return rt.clock() + timedelta(seconds=RUN_START_WINDOW_S)


def _settle_finished(
    rt: Runtime, job_id: uuid.UUID, net_name: str, nvflare_job_id: str
) -> JobState:
    """The run had already finished when the abort came: record how it finished
    (`run_outcome`: never COMPLETED on a net where that means "results uploaded")."""
    holds = _holds_for_report(rt, net_name)
    try:
        status = rt.admin(net_name).job_status(nvflare_job_id)
        outcome, detail, code = run_outcome(status.state, status.detail, JobState.ABORTING, holds)
        unstarted = status.unstarted
    except DispatcherError as exc:
        outcome, detail, code = JobState.ABORTED, str(exc), ReasonCode.ABORTED
        unstarted = True  # unknown: perhaps a mark made before the run started
    # "Finished" by an abort before it started (an earlier try of this one whose answer was
    # lost, or an unreadable status that may be that): the job runner may still start it.
    end = RunEnd.UNSTARTED if unstarted else RunEnd.OVER
    run = (net_name, nvflare_job_id, end)
    reason = f"finished before abort: {detail}"
    # An ABORTING job is never held for a report: the code is never None.
    _finish(rt, job_id, run, outcome, reason=reason, code=code or ReasonCode.ABORTED)
    return outcome


def expire_abort(rt: Runtime, job_id: uuid.UUID) -> JobState:
    """An abort the server never confirmed within ABORT_TIMEOUT_S: the job is ABORTED with
    the reason, and its run is not left running: a scale-to-zero net is taken down, an
    always-on net keeps it as a stray run (no new job there until it is settled)."""
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        if job.state != JobState.ABORTING:
            return job.state
        net_name, nvflare_job_id, token = job.net_name, job.nvflare_job_id, job.submit_token
        reason = f"abort not confirmed within {rt.settings.abort_timeout_s:.0f}s"
        if net_name is not None:
            records.add_stray_run(
                session,
                net_name=net_name,
                job_id=job_id,
                nvflare_job_id=nvflare_job_id,
                submit_token=token,
                reason=reason,
                now=rt.clock(),
            )
        records.finish_job(
            session,
            job_id,
            JobState.ABORTED,
            reason,
            rt.clock(),
            code=ReasonCode.ABORT_UNCONFIRMED,
        )
    log.error("abort expired", extra={"job": str(job_id), "net": net_name, "reason": reason})
    if net_name is not None and _scales_to_zero(rt, net_name):
        take_down(rt, net_name, f"run of job {job_id} could not be aborted")
    kick(rt)
    return JobState.ABORTED


def _holds_for_report(rt: Runtime, net_name: str) -> bool:
    return rt.settings.has_net(net_name) and rt.settings.net(net_name).holds_for_report(
        rt.settings.release_after
    )


def _scales_to_zero(rt: Runtime, net_name: str) -> bool:
    return rt.settings.has_net(net_name) and rt.settings.net(net_name).scales_to_zero


def resting(rt: Runtime, name: str) -> bool:
    """A net whose strays reconcile does not ask about this round: one MISCONFIGURED, on any
    backend (its settings are wrong: what answers may be another server; its strays wait for
    the human's fix, or are forgotten at zero replicas, `forget_dead_strays`), or a STOPPED
    one whose strays only its server's word settles (`runs_revive`): no server to ask, and
    reconcile neither calls it nor logs each round of its rest; it is started to settle
    them (`_start_to_settle`)."""
    with rt.sessions() as session:
        state = records.get_net(session, name).state
    return state == NetState.MISCONFIGURED or (state == NetState.STOPPED and runs_revive(rt, name))


def _misconfigured(rt: Runtime, name: str) -> bool:
    with rt.sessions() as session:
        return records.get_net(session, name).state == NetState.MISCONFIGURED


def settle_stray_runs(rt: Runtime, net_name: str) -> int:
    """Abort the net's stray runs that its server still holds; forget those that are over.
    A server that cannot be reached keeps them (they are settled when it answers, or when
    the net is scaled to zero). Returns how many are left."""
    with rt.sessions() as session:
        strays = [
            (s.id, s.nvflare_job_id, s.submit_token)
            for s in session.scalars(select(StrayRun).where(StrayRun.net_name == net_name))
        ]
    if not strays or not rt.settings.has_net(net_name) or _misconfigured(rt, net_name):
        # Whoever sent this settle (reconcile, or a late submit's "landed after the job moved
        # on"): a MISCONFIGURED net is asked nothing: what answers may be another server
        # (chaos 9773: the late submit's settle called job_status there).
        return len(strays)
    admin = rt.admin(net_name)
    # A server that keeps no token (Flower) may hold a later run of the stray's token whose
    # id was never learnt: the lookup stops it (`find_run`), so it is done even when the
    # stray names its run (and a lookup that cannot stop it raises: the stray is kept).
    by_lookup = rt.settings.net(net_name).tokens_by_lookup
    # On a net whose pending runs revive (Flower) no take-down settles a stray, so the
    # server's word must: a Flower stop is final (the run reads finished:stopped at once and
    # never starts after), so its answer, stopped or already finished, says the run is over,
    # where a status read may never answer (sweep seed 67: a run with no status).
    stop_is_final = runs_revive(rt, net_name)
    left = 0
    for stray_id, nvflare_job_id, token in strays:
        fresh: datetime | None = None
        try:
            looked_up = (
                admin.find_run(token) if token and (by_lookup or not nvflare_job_id) else None
            )
            run_id = nvflare_job_id or looked_up
            if run_id is not None:
                outcome = admin.abort(run_id).outcome
                # Settled only once the server, answering now, says the run is over: an
                # accepted abort takes a moment to stop it, and "nothing to abort" also
                # covers a server that could not be reached.
                if stop_is_final and outcome in (
                    AbortOutcome.ABORTED,
                    AbortOutcome.ALREADY_FINISHED,
                ):
                    end = RunEnd.OVER
                else:
                    end = over_after_abort(rt, net_name, run_id, outcome)
                if outcome == AbortOutcome.ABORTED_BEFORE_START:
                    fresh = window_end(rt, end)  # this abort's own mark: the window restarts
            else:
                end = RunEnd.OVER
        except NvflareJobNotFound:
            end = RunEnd.OVER
        except DispatcherError as exc:
            log.warning("stray run not settled yet", extra={"net": net_name, "reason": str(exc)})
            end = RunEnd.GOING
        if not _settle_one(rt, stray_id, end, fresh):
            left += 1
    if left < len(strays):
        kick(rt)
    return left


def _settle_one(rt: Runtime, stray_id: int, end: RunEnd, fresh: datetime | None) -> bool:
    """Forget the stray if its run is over and its window (pushed to `fresh` by an abort
    answered before start) has passed; else keep it, its window set. True when gone."""
    with unit_of_work(rt.sessions) as session:
        # Decided on the row as it is now, locked: another round (a kick's and beat's at
        # once) may have pushed its window on meanwhile.
        stray = session.get(StrayRun, stray_id, with_for_update=True)
        if stray is None:
            return True  # settled by another round
        hold = records.later(stray.settle_after, fresh)
        now = rt.clock()
        if end == RunEnd.UNSTARTED and hold is None:
            hold = window_end(rt, end)  # first seen aborted before it started: from now
        elif hold is not None:
            # A window ends at most its length from now: a clock stepped back (an NTP
            # correction, a VM restored) restarts it, not holds the net that much longer.
            hold = min(hold, now + timedelta(seconds=RUN_START_WINDOW_S))
        if end in (RunEnd.OVER, RunEnd.UNSTARTED) and (hold is None or now >= hold):
            session.delete(stray)
            return True
        stray.settle_after = hold
        return False


def expire_stray_runs(rt: Runtime, net_name: str) -> bool:
    """A scale-to-zero net whose server has not let a stray run be settled within
    ABORT_TIMEOUT_S (it cannot say how the run stands, or the abort does not take) is taken
    down while idle: the run dies with its server, and jobs waiting for the net get a fresh
    one. An always-on net keeps its strays (nothing here can restart its server): they are
    logged for an operator. True when the net was taken down."""
    with rt.sessions() as session:
        strays = session.execute(
            select(StrayRun.created_at, StrayRun.settle_after).where(StrayRun.net_name == net_name)
        ).all()
    # Counted from when each was recorded, so a window pushed on and on never keeps a stray
    # from expiring; one held for its start window is overdue no sooner than that window
    # (an ABORT_TIMEOUT_S shorter than it would take down a net whose stray settles itself).
    held_timeout_s = max(rt.settings.abort_timeout_s, RUN_START_WINDOW_S)
    now = rt.clock()
    overdue = [
        created_at
        for created_at, held in strays
        if (now - created_at).total_seconds()
        >= (rt.settings.abort_timeout_s if held is None else held_timeout_s)
    ]
    if not overdue:
        return False
    reason = f"stray run(s) unsettled for over {rt.settings.abort_timeout_s:.0f}s"
    # A net whose pending runs revive is not taken down either: its strays outlive their
    # server (reconcile starts it again to settle them).
    if not _scales_to_zero(rt, net_name) or runs_revive(rt, net_name):
        log.error("stray runs need an operator", extra={"net": net_name, "reason": reason})
        return False
    return take_down(rt, net_name, reason)

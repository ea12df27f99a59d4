"""A busy net's runs when its server cannot be watched: the lost-server count and the runs
lost with the server.

A monitor round that cannot reach a net's server counts a round on the net's row
(`Net.missed`: since when, how many rounds in a row); an answer restarts the count
(`Net.answered`, or `answered` here for the rounds that read the net healthy). Past both
SERVER_LOST_GRACE_S and SERVER_LOST_ROUNDS its runs are lost: LOST_JOB_POLICY requeues or
fails the job (an ABORTING one is ABORTED), the run kept as a stray until a server that
answers settles it. The awaited-run poll (every second while a QUEUED job waits for the net)
starts the grace but counts no round: beside the full round of the same tick it would count
one failure twice, and two failed calls the grace apart are no lost server (seed 6634)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.orm import Session

from app import names
from app.db import unit_of_work
from app.errors import DispatcherError, FilesNameAnotherServer, MisconfigurationError
from app.runtime import Runtime
from app.usecases import records
from app.usecases.abort import stray_token
from app.usecases.scaling import kick, net_misconfigured, take_down
from models import JobState, Net, ReasonCode

log = logging.getLogger(__name__)


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
    traceparent: str | None = None  # the job's trace (app/traces.py)
    verdict: str | None = None  # the net's files name another server (misconfigured_after_job)


STALE = "job moved on since this round read it; nothing done"


def watched_state(session: Session, job: Watched) -> JobState | None:
    """The job's state now (row locked) if it still has the run this round watched, else
    None. A round's snapshot can be seconds old when it acts (a call to a dead server waits
    its timeout, and rounds overlap); by then the job may have been settled and even be on
    its next attempt, which a verdict about the old run must never touch."""
    row = records.get_job(session, job.job_id, lock=True)
    watching = (JobState.RUNNING, JobState.ABORTING)
    if row.state in watching and row.nvflare_job_id == job.nvflare_job_id:
        return row.state
    return None


def keep_as_stray(
    rt: Runtime, session: Session, job: Watched, reason: str, hold: datetime | None = None
) -> None:
    """Record the job's run as a stray run, to be settled by a server that answers."""
    records.add_stray_run(
        session,
        net_name=job.net_name,
        job_id=job.job_id,
        nvflare_job_id=job.nvflare_job_id,
        submit_token=stray_token(rt, session, job.job_id, job.net_name),
        reason=reason,
        now=rt.clock(),
        settle_after=hold,
    )


def lost(rt: Runtime, job: Watched, reason: str) -> str:
    """A run whose server was lost: requeue or fail per LOST_JOB_POLICY; an ABORTING job
    is simply ABORTED (the user wanted it stopped and it is). The run, which may still be
    alive (a server only the admin side could not reach, a restart seen through a stale
    start time), is recorded as a stray run: a server that answers settles it at once (its
    abort), and on a scale-to-zero net one that does not dies with its server before the
    job can run anywhere again."""
    restarted = reason.startswith("server restarted")
    with unit_of_work(rt.sessions) as session:
        state = watched_state(session, job)
        if state is None:
            return STALE
        keep_as_stray(rt, session, job, reason)
        if state == JobState.ABORTING:
            records.finish_job(
                session, job.job_id, JobState.ABORTED, reason, rt.clock(), code=ReasonCode.ABORTED
            )
            outcome = "aborted"
        elif rt.settings.lost_job_policy == "requeue":
            outcome = (
                "requeued"
                if records.requeue_job(session, job.job_id, reason, rt.clock())
                else "failed"
            )
        else:
            records.finish_job(
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
    if restarted:
        rt.outbox.send(names.SETTLE_STRAY_RUNS, net_name=job.net_name)
    elif rt.settings.net(job.net_name).scales_to_zero:
        take_down(rt, job.net_name, f"run of job {job.job_id} lost: {reason}")
    kick(rt)
    return outcome


def unwatchable(
    rt: Runtime,
    net_name: str,
    jobs: list[Watched],
    exc: DispatcherError,
    now: datetime,
    *,
    counts: bool = True,
) -> dict[str, str]:
    """The server could not be watched: one more failed round (`counts`: not the awaited
    poll's), and past the grace and SERVER_LOST_ROUNDS its runs are lost."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, net_name, lock=True)
        if isinstance(exc, FilesNameAnotherServer) and net.misconfigured_after_job is None:
            # A start found the files right since the round's read: nothing to count.
            return {str(j.job_id): f"not watched: {exc} (since fixed)" for j in jobs}
        gone_s, rounds = net.missed(now, counts=counts)
        net.last_error = f"monitor: {exc}"[:2000]  # bounded as `isolated` bounds its own
    # Lost takes the grace and that many rounds in a row: two failed calls the grace apart (a
    # sparse beat) are no lost server, and a run completed meanwhile would rerun (seed 6634).
    if gone_s < rt.settings.server_lost_grace_s or rounds < rt.settings.server_lost_rounds:
        return {str(j.job_id): f"server not answering for {gone_s:.0f}s: {exc}" for j in jobs}
    results = {
        str(j.job_id): lost(rt, j, f"server not answering for {gone_s:.0f}s: {exc}") for j in jobs
    }
    if isinstance(exc, MisconfigurationError):
        net_misconfigured(rt, net_name, None, f"admin access failed on a busy net: {exc}")
    return results


def answered(rt: Runtime, net_names: Iterable[str]) -> None:
    """These nets' servers answered a round that read them healthy: a failure another round
    counted meanwhile (rounds overlap: a call waits its timeout, the awaited poll runs beside
    the full round) is over. One statement for the round, a no-op on healthy rows."""
    nets = sorted(set(net_names))
    if not nets:
        return
    with unit_of_work(rt.sessions) as session:
        session.execute(
            update(Net)
            .where(Net.name.in_(nets), Net.unreachable_since.is_not(None))
            .values(unreachable_since=None, unreachable_rounds=0, version=Net.version + 1)
            .execution_options(synchronize_session=False)
        )

"""Step leases: a job in the dispatch chain (ASSIGNED or DISPATCHING) carries `step_due_at`,
the time by which the worker holding its current step will be heard of again (the step's
next write, or the next step's). Every step, and every retry or poll it schedules, moves it
on; past it the holder is gone (killed, or its next message lost) and the job is re-driven
at once: the chain started again for an ASSIGNED job, the submit re-sent with its stored
token for a DISPATCHING one. The check runs every HOUSEKEEPING_INTERVAL_S (the monitor
round) and in every reconcile, so a worker's death costs at most one lease and one interval.

A re-drive takes a new lease itself, under the job's row lock, so the job is re-driven once
per lapse, never once per process that noticed; a step waiting its retry's countdown holds
a lease past that countdown, so it is never re-driven beside itself."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, bindparam, or_, select

from app import names
from app.db import unit_of_work
from app.runtime import Runtime
from app.settings import Settings
from app.usecases import records
from app.usecases.housekeeping import isolated
from models import Job, JobState

log = logging.getLogger(__name__)

# Added to a try's own timeouts before its worker counts as gone (a commit, a log line, a
# busy machine).
TRY_MARGIN_S = 15.0

LEASED_STATES = (JobState.ASSIGNED, JobState.DISPATCHING)


def step_try_s(settings: Settings) -> float:
    """How long one try of a step may take: a fresh login, one command (a submit, a
    readiness check), and a margin for the worker's own bookkeeping."""
    return settings.admin_login_timeout_s + settings.admin_command_timeout_s + TRY_MARGIN_S


def poll_lease_s(settings: Settings) -> float:
    """A readiness poll's lease, taken as it starts: the poll itself, then READY_POLL_S
    until the next poll takes its own."""
    return settings.ready_poll_s + step_try_s(settings)


def handoff_lease_s(settings: Settings) -> float:
    """The lease of a job whose next step is a message not yet taken (a claim's chain, a
    re-drive): one try, whose margin covers the hop to a worker. A pipeline queue backed up
    past it costs a second chain for the attempt (harmless), never a minute more."""
    return step_try_s(settings)


def redrive_bound_s(settings: Settings) -> float:
    """The longest a job waits, after its step's worker died, before it is re-driven: the
    longest lease a live step holds between two of its writes (a poll's) plus one check
    period. A retry's countdown is added to it when the worker died waiting one."""
    return poll_lease_s(settings) + settings.housekeeping_interval_s


def hold(job: Job, now: datetime, lease_s: float) -> None:
    """The step that holds `job` (already checked to be its attempt) will be heard of again
    within `lease_s`."""
    job.step_due_at = now + timedelta(seconds=lease_s)


def lapsed(due_at: datetime | None, now: datetime) -> bool:
    """No worker holds the job's step any more: the time by which its holder had to be
    heard of again is past. A row from before the lease existed has none: its holder is
    taken as gone."""
    return due_at is None or now > due_at


def retry_budget_s(settings: Settings) -> float:
    """How long a submit's own tries may go on: every retry's wait and every try's own time
    (a login and the submit command), not only the waits."""
    return float(settings.retry_max * (settings.retry_backoff_max_s + step_try_s(settings)))


@dataclass(frozen=True)
class Leased:
    """A job in the dispatch chain as a housekeeping round read it."""

    job_id: uuid.UUID
    state: JobState
    net_name: str | None
    attempt: int
    changed_at: datetime
    due_at: datetime | None


# The columns a round reads of each leased job, in `Leased`'s order.
LEASED_COLUMNS = (
    Job.id,
    Job.state,
    Job.net_name,
    Job.attempts,
    Job.state_changed_at,
    Job.step_due_at,
)
_LAPSED = select(*LEASED_COLUMNS).where(
    Job.state.in_(LEASED_STATES),
    or_(
        Job.step_due_at < bindparam("now"),
        # A submit from before the lease existed: its holder is taken as gone.
        and_(Job.state == JobState.DISPATCHING, Job.step_due_at.is_(None)),
    ),
)


def lease_passed(job: Leased, now: datetime) -> bool:
    """What `_LAPSED` asks in SQL, of a row a round read already: a lease that passed, or a
    DISPATCHING job with none (an ASSIGNED job with none is reconcile's, by its age)."""
    if job.due_at is None:
        return job.state == JobState.DISPATCHING
    return job.due_at < now


def redrive_lapsed_steps(
    rt: Runtime, leased: Iterable[Leased] | None = None, now: datetime | None = None
) -> dict[str, str]:
    """Re-drive every job whose step lease has passed: the chain of an ASSIGNED job is
    started again (every step is idempotent and bound to the job's attempt), the submit of
    a DISPATCHING job re-sent with its stored token (NVFLARE returns the run it already
    has). A DISPATCHING job past its retry budget is left to reconcile, which abandons it.
    `leased`: the round's own read of the leased jobs at `now` (else read here). Returns
    what was done, by job id."""
    now = now or rt.clock()
    if leased is None:
        with rt.sessions() as session:
            leased = [Leased(*row) for row in session.execute(_LAPSED, {"now": now})]
    rows = [
        (job.job_id, job.state, job.net_name, job.attempt, job.changed_at)
        for job in leased
        if job.state in LEASED_STATES and lease_passed(job, now)
    ]
    budget_s = retry_budget_s(rt.settings) + rt.settings.stuck_after_s
    redriven: dict[str, str] = {}
    for job_id, state, net_name, attempt, changed_at in rows:
        if net_name is None or not rt.settings.has_net(net_name):
            continue  # an undeclared net's jobs are settled by reconcile
        if state == JobState.DISPATCHING and (now - changed_at).total_seconds() > budget_s:
            continue  # reconcile abandons it, settling its token
        with isolated(rt, "redrive_lapsed_steps", net_name):
            if not _take_over(rt, job_id, state, net_name, attempt):
                continue
            if state == JobState.ASSIGNED:
                sent = rt.outbox.start_pipeline(str(job_id), net_name, attempt)
                what = "pipeline re-driven"
            else:
                sent = rt.outbox.send(
                    names.DISPATCH, job_id=str(job_id), net_name=net_name, attempt=attempt
                )
                what = "dispatch re-sent"
            # A send the broker refused leaves the new lease to lapse: the next round tries
            # again. Said as it is, not as done.
            redriven[str(job_id)] = what if sent else f"{what}: the broker refused it"
            log.warning(
                "step lease passed: its worker is gone; re-driven"
                if sent
                else "step lease passed: re-drive refused by the broker; tried again later",
                extra={"job": str(job_id), "net": net_name, "state": str(state)},
            )
    return redriven


def _take_over(
    rt: Runtime, job_id: uuid.UUID, state: JobState, net_name: str, attempt: int
) -> bool:
    """Under the row lock: the job is still at this step of this attempt with its lease
    passed, and the re-drive now holds it (a new lease), so no other round re-drives it."""
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        now = rt.clock()
        if (job.state, job.net_name, job.attempts) != (state, net_name, attempt):
            return False
        if not lapsed(job.step_due_at, now):
            return False
        hold(job, now, handoff_lease_s(rt.settings))
        return True

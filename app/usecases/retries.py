"""A chain step's transient retries: each counted and its lease moved to the next try
(`count_retry`), how long one submit try may take (`submit_try_s`), and once a step's
retries are spent, its attempt requeued, never deleted (`requeue_after_transient`). Called
by the task base (tasks/base.py) and the reconciler; the steps themselves are in
`dispatch`."""

from __future__ import annotations

import logging
import uuid

from app.db import unit_of_work
from app.runtime import Runtime
from app.settings import Settings
from app.usecases import records
from app.usecases.scaling import kick
from app.usecases.step_leases import LEASED_STATES, hold, step_try_s
from models import Job, JobState

log = logging.getLogger(__name__)


def _bound(job: Job, state: JobState, net_name: str, attempt: int) -> bool:
    """The job is still the (state, net, attempt) the step was started for."""
    return job.state == state and job.net_name == net_name and job.attempts == attempt


def requeue_after_transient(
    rt: Runtime,
    job_id: uuid.UUID,
    reason: str,
    *,
    net_name: str | None = None,
    attempt: int | None = None,
) -> bool:
    """A pipeline step ran out of retries on a transient error: requeue, never delete.

    Only the attempt the step was started for is touched (the job ASSIGNED to `net_name`
    at `attempt`, re-read under its lock): by the time retries run out, a re-sent step may
    have dispatched the job, or it may be on its next attempt elsewhere, and neither is this
    step's to move. A step with no such binding moves nothing.

    A DISPATCHING job's submit may have landed with its reply lost, so its attempt is not
    abandoned with a new token while the old one may own a run: it stays DISPATCHING (the
    reconciler re-sends the same token, which adopts the run) until `abandon_dispatch`
    settles it by taking the server down.
    """
    if net_name is None or attempt is None:
        return False
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        if _bound(job, JobState.DISPATCHING, net_name, attempt):
            log.warning("submit outcome unknown; attempt kept", extra={"job": str(job_id)})
            return False
        if not _bound(job, JobState.ASSIGNED, net_name, attempt):
            log.info(
                "retries exhausted for an attempt that is over; nothing to requeue",
                extra={"job": str(job_id), "net": net_name, "state": str(job.state)},
            )
            return False
        requeued = records.requeue_job(session, job_id, reason, rt.clock())
    kick(rt)
    return requeued


def submit_try_s(settings: Settings) -> float:
    """How long one submit try may take: a fresh login, the submit command, and a margin
    for the worker's own bookkeeping. A worker not heard of past it is gone."""
    return step_try_s(settings)


def count_retry(rt: Runtime, job_id: uuid.UUID, next_try_in_s: float | None = None) -> None:
    """One more transient retry of this job's pipeline (a metric), and, for a job in the
    chain, when its worker will be heard of again: the next try's start plus one try (so a
    step waiting its countdown is never re-driven beside itself)."""
    with unit_of_work(rt.sessions) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is not None:
            job.retries += 1
            if job.state in LEASED_STATES and next_try_in_s is not None:
                hold(job, rt.clock(), next_try_in_s + step_try_s(rt.settings))

"""A job whose definition cannot run (its bundle invalid, missing, too large or unavailable
for good): failed at once with the reason code that says which, as no retry can help and the
net is fine. Used by the dispatch chain's steps (`dispatch`), which meet the definition."""

from __future__ import annotations

import uuid

from app.db import unit_of_work
from app.errors import BundleMissing, BundleTooLarge, BundleUnavailable, DispatcherError
from app.runtime import Runtime
from app.usecases import records
from app.usecases.scaling import kick, release_unstarted_net
from models import JobState, ReasonCode


def fail_job(
    rt: Runtime,
    job_id: uuid.UUID,
    net_name: str,
    attempt: tuple[JobState, int],
    exc: DispatcherError,
) -> JobState | None:
    """Fail the job: its definition itself is bad or gone. Only the attempt the step was
    started for is failed; a job that moved on is left, and its state returned (None: failed)."""
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        if (job.state, job.net_name, job.attempts) != (attempt[0], net_name, attempt[1]):
            return job.state
        code = definition_code(exc)
        # Never worded "rejected": that is a refused enqueue, which created no job.
        records.finish_job(
            session, job_id, JobState.FAILED, f"{code}: {exc}", rt.clock(), code=code
        )
    release_unstarted_net(rt, net_name, job_id)
    kick(rt)
    return None


def definition_code(exc: DispatcherError) -> ReasonCode:
    """Why a job's definition cannot run, as its reason code."""
    if isinstance(exc, BundleMissing):
        return ReasonCode.BUNDLE_MISSING
    if isinstance(exc, BundleTooLarge):
        return ReasonCode.BUNDLE_TOO_LARGE
    if isinstance(exc, BundleUnavailable):
        return ReasonCode.BUNDLE_UNAVAILABLE
    return ReasonCode.DEFINITION_INVALID

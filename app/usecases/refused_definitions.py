"""A job whose definition cannot run (its bundle invalid, missing, too large or unavailable
for good): failed at once with the reason code that says which, as no retry can help and the
net is fine. Used by the dispatch chain's steps (`dispatch`), which meet the definition."""

from __future__ import annotations

import uuid

from app import names
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
    *,
    may_have_sent: bool = True,
) -> JobState | None:
    """Fail the job: its definition itself is bad or gone. Only the attempt the step was
    started for is failed; a job that moved on is left, and its state returned (None: failed).
    `may_have_sent`: False when the failing try stored the token itself (nothing was sent
    with it yet), so no stray is kept for it."""
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        if (job.state, job.net_name, job.attempts) != (attempt[0], net_name, attempt[1]):
            return job.state
        code = definition_code(exc)
        reason = f"{code}: {exc}"  # never worded "rejected": that is a refused enqueue
        # A DISPATCHING job's earlier try may have submitted (its reply lost): that run,
        # known by the stored token, is kept as a stray, so the net takes no job beside it
        # until its server says it is over (settled at once below: looked up and aborted).
        submitted = (
            may_have_sent and job.state == JobState.DISPATCHING and job.submit_token is not None
        )
        if submitted:
            records.add_stray_run(
                session,
                net_name=net_name,
                job_id=job_id,
                nvflare_job_id=None,
                submit_token=job.submit_token,
                reason=reason,
                now=rt.clock(),
            )
        records.finish_job(session, job_id, JobState.FAILED, reason, rt.clock(), code=code)
    if submitted:
        rt.outbox.send(names.SETTLE_STRAY_RUNS, net_name=net_name)
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

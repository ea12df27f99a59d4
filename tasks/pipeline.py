"""The dispatch chain: assign_next_job -> scale_up -> wait_ready -> dispatch."""

from __future__ import annotations

import uuid
from typing import Any

from app import names
from app.usecases import abort as abort_uc
from app.usecases import dispatch as dispatch_uc
from app.usecases.dispatch import Step
from tasks.base import dispatcher_task, runtime


@dispatcher_task(names.ASSIGN_NEXT_JOB)
def assign_next_job(self: Any) -> int:
    """Claim QUEUED jobs onto free nets and start a chain for each claim."""
    return len(dispatch_uc.assign_jobs(runtime()))


@dispatcher_task(names.SCALE_UP, pipeline=True)
def scale_up(self: Any, job_id: str, net_name: str) -> str:
    """Ask the net's driver for one replica."""
    return dispatch_uc.scale_up(runtime(), uuid.UUID(job_id), net_name).step


@dispatcher_task(names.WAIT_READY, pipeline=True, max_retries=None)
def wait_ready(self: Any, job_id: str, net_name: str) -> str:
    """Poll readiness at a short fixed interval; the readiness deadline, not a retry count,
    ends the wait (check_ready gives up and requeues past it)."""
    rt = runtime()
    result = dispatch_uc.check_ready(rt, uuid.UUID(job_id), net_name)
    if result.step == Step.NOT_READY:
        raise self.retry(countdown=rt.settings.ready_poll_s, max_retries=None)
    return result.step


@dispatcher_task(names.DISPATCH, pipeline=True)
def dispatch(self: Any, job_id: str) -> str:
    """Submit the job with its stored submit token."""
    return dispatch_uc.dispatch(runtime(), uuid.UUID(job_id)).step


@dispatcher_task(names.ABORT_ON_SERVER, pipeline=True)
def abort_on_server(self: Any, job_id: str) -> str:
    """Abort an ABORTING job's run on its server."""
    return abort_uc.abort_on_server(runtime(), uuid.UUID(job_id))

"""The dispatch chain: assign_next_job -> scale_up -> wait_ready -> dispatch. Each step is
bound to one (job, net, attempt); a step that skipped or gave up ends its chain, and so does
a scale_up that found the net warm and submitted the job itself."""

from __future__ import annotations

import uuid
from typing import Any

from app import names
from app.usecases import abort as abort_uc
from app.usecases import dispatch as dispatch_uc
from app.usecases import kicks
from app.usecases.dispatch import Step, StepResult
from tasks.base import dispatcher_task, runtime


def _end_chain_if_over(task: Any, result: StepResult) -> str:
    if result.step.ends_chain:
        task.request.chain = None  # Celery runs no further step of this chain
    return str(result.step)


@dispatcher_task(names.ASSIGN_NEXT_JOB)
def assign_next_job(self: Any) -> int:
    """Take the pending kick, then claim QUEUED jobs onto free nets and start a chain for
    each claim."""
    return len(kicks.assign_after_kick(runtime()))


@dispatcher_task(names.SCALE_UP, pipeline=True)
def scale_up(self: Any, job_id: str, net_name: str, attempt: int = 0) -> str:
    """Ask the net's driver for one replica; on a warm net, also check readiness and submit
    (the chain then ends here)."""
    result = dispatch_uc.start(runtime(), uuid.UUID(job_id), net_name, attempt)
    return _end_chain_if_over(self, result)


@dispatcher_task(names.WAIT_READY, pipeline=True, max_retries=None)
def wait_ready(self: Any, job_id: str, net_name: str, attempt: int = 0) -> str:
    """Poll readiness at a short fixed interval; the readiness deadline, not a retry count,
    ends the wait (check_ready gives up and requeues past it)."""
    rt = runtime()
    result = dispatch_uc.check_ready(rt, uuid.UUID(job_id), net_name, attempt)
    if result.step == Step.NOT_READY:
        raise self.retry(countdown=rt.settings.ready_poll_s, max_retries=None)
    return _end_chain_if_over(self, result)


@dispatcher_task(names.DISPATCH, pipeline=True)
def dispatch(self: Any, job_id: str, net_name: str, attempt: int = 0) -> str:
    """Submit the job with its stored submit token."""
    return str(dispatch_uc.dispatch(runtime(), uuid.UUID(job_id), net_name, attempt).step)


@dispatcher_task(names.ABORT_ON_SERVER, pipeline=True)
def abort_on_server(self: Any, job_id: str) -> str:
    """Abort an ABORTING job's run on its server."""
    return str(abort_uc.abort_on_server(runtime(), uuid.UUID(job_id)))


@dispatcher_task(names.SETTLE_STRAY_RUNS)
def settle_stray_runs(self: Any, net_name: str) -> int:
    """Abort runs the net's server holds that no job counts."""
    return abort_uc.settle_stray_runs(runtime(), net_name)

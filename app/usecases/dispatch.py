"""The dispatch chain: claim jobs onto nets, scale up, wait until ready, submit.

Every function here is idempotent: it re-reads the rows it acts on, does nothing if the
work is done, and keeps calls to a driver or an NVFLARE server OUTSIDE any transaction
that holds a row lock (a slow server must never block the queue). Follow-up tasks go out
through `rt.outbox` only after the transaction that made them necessary has committed.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy.orm import Session

from app import names
from app.adapters.jobdefs import materialize
from app.adapters.nvflare.base import Readiness
from app.db import unit_of_work
from app.errors import (
    DispatcherError,
    InvalidRequest,
    JobOutcomeError,
    MisconfigurationError,
    TransientError,
)
from app.runtime import Runtime
from app.usecases import services
from app.usecases.scaling import kick, net_misconfigured, scale_net
from models import Job, JobState, NetState

log = logging.getLogger(__name__)


# NVFLARE 2.9.0 RunStatus (nvflare/apis/job_def.py) -> our terminal state. Statuses not
# listed (SUBMITTED, APPROVED, DISPATCHED, RUNNING) mean "still going": a SUBMITTED job
# waits for its sites and still occupies the server.
NVFLARE_OUTCOMES: dict[str, JobState] = {
    "FINISHED:COMPLETED": JobState.COMPLETED,
    "FINISHED:ABORTED": JobState.ABORTED,
    "FINISHED:EXECUTION_EXCEPTION": JobState.FAILED,
    "FINISHED:FAILED_TO_RUN": JobState.FAILED,
    "FINISHED:CAN_NOT_SCHEDULE": JobState.FAILED,
}
# The run ended without a verdict: decided by LOST_JOB_POLICY like a lost server.
NVFLARE_LOST = frozenset({"FINISHED:ABNORMAL", "FINISHED:ABANDONED"})


class Step(StrEnum):
    """What a pipeline step did."""

    DONE = "done"
    SKIPPED = "skipped"  # the job moved on (aborted, requeued, already done): nothing to do
    NOT_READY = "not_ready"  # poll again
    GAVE_UP = "gave_up"  # past the deadline: job requeued, net marked


@dataclass(frozen=True)
class StepResult:
    """A step's outcome with a reason for the log and the test."""

    step: Step
    detail: str = ""


# --- the dispatch pipeline -------------------------------------------------------------


def assign_jobs(rt: Runtime, limit: int = 50) -> list[services.Assignment]:
    """Claim QUEUED jobs onto free nets, one transaction per claim, and start a pipeline
    for each after its claim has committed."""
    claimed = []
    for _ in range(limit):
        with unit_of_work(rt.sessions) as session:
            assignment = services.assign_next_job(session, rt.settings, rt.clock())
        if assignment is None:
            break
        rt.outbox.start_pipeline(str(assignment.job_id), assignment.net_name)
        claimed.append(assignment)
    return claimed


def _assigned(session: Session, job_id: uuid.UUID, net_name: str) -> Job | None:
    job = services.get_job(session, job_id)
    if job.state != JobState.ASSIGNED or job.net_name != net_name:
        return None
    return job


def scale_up(rt: Runtime, job_id: uuid.UUID, net_name: str) -> StepResult:
    """Step 1: the net's driver asked for one replica (no-op for a warm or always-on net)."""
    with unit_of_work(rt.sessions) as session:
        job = _assigned(session, job_id, net_name)
        if job is None:
            return StepResult(Step.SKIPPED, "job no longer assigned to this net")
        net_state = services.get_net(session, net_name).state
    if rt.settings.net(net_name).always_on:
        return StepResult(Step.DONE, "always-on net: never scaled")
    if net_state in (NetState.READY, NetState.BUSY) and rt.driver(net_name).observe().is_up:
        # A warm net is reused as is; but one whose server died unnoticed is scaled again.
        return StepResult(Step.DONE, "server already up")
    try:
        scale_net(rt, net_name, 1, f"job {job_id} assigned")
    except MisconfigurationError as exc:
        net_misconfigured(rt, net_name, job_id, str(exc))
        raise
    return StepResult(Step.DONE, "driver asked for 1 replica")


def check_ready(rt: Runtime, job_id: uuid.UUID, net_name: str) -> StepResult:
    """Step 2: is the net ready for this job? Driver running, a FRESH admin login, server
    answering, every required site connected. Past the readiness deadline: give up."""
    now = rt.clock()
    net_config = rt.settings.net(net_name)
    always_on = net_config.always_on
    with unit_of_work(rt.sessions) as session:
        job = _assigned(session, job_id, net_name)
        if job is None:
            return StepResult(Step.SKIPPED, "job no longer assigned to this net")
        required = list(job.required_sites)
        assigned_at = job.assigned_at or now

    readiness: Readiness | None = None
    detail = ""
    try:
        observation = None if always_on else rt.driver(net_name).observe()
        if observation is not None and observation.failure:
            return _give_up_readiness(rt, job_id, net_name, f"driver: {observation.failure}")
        if observation is not None and not observation.is_up:
            detail = (
                f"driver: desired={observation.desired} running={observation.running} "
                f"pending={observation.pending}"
            )
        else:
            readiness = rt.admin(net_name).is_ready(required)
            detail = readiness.detail or f"missing sites {list(readiness.missing_sites)}"
    except MisconfigurationError as exc:  # wrong kit or CA, missing service: never "down"
        net_misconfigured(rt, net_name, job_id, str(exc))
        raise
    except TransientError as exc:
        detail = f"transient: {exc}"

    if readiness is not None and readiness.ready:
        with unit_of_work(rt.sessions) as session:
            net = services.get_net(session, net_name, lock=True)
            if net.state != NetState.READY:
                net.transition(NetState.READY, rt.clock(), f"ready for job {job_id}")
            net.server_start_time = readiness.server_start_time
            net.unreachable_since = None
        return StepResult(Step.DONE, "ready")

    if (now - assigned_at).total_seconds() > net_config.ready_timeout_s:
        return _give_up_readiness(
            rt, job_id, net_name, f"not ready after {net_config.ready_timeout_s:.0f}s: {detail}"
        )
    return StepResult(Step.NOT_READY, detail)


def _give_up_readiness(rt: Runtime, job_id: uuid.UUID, net_name: str, reason: str) -> StepResult:
    """Requeue the job and mark the net: UNHEALTHY (scaled down) or, always-on, OUTAGE."""
    always_on = rt.settings.net(net_name).always_on
    with unit_of_work(rt.sessions) as session:
        services.requeue_job(session, job_id, reason, rt.clock())
        net = services.get_net(session, net_name, lock=True)
        target = NetState.OUTAGE if always_on else NetState.UNHEALTHY
        if net.state != target:
            net.transition(target, rt.clock(), reason)
        net.last_error = reason
    log.error(
        "net not ready past its deadline",
        extra={"net": net_name, "job": str(job_id), "reason": reason},
    )
    if not always_on:
        try:
            scale_net(rt, net_name, 0, "readiness deadline passed")
        except DispatcherError:
            log.exception("scale-down after readiness failure failed", extra={"net": net_name})
    kick(rt)
    return StepResult(Step.GAVE_UP, reason)


def dispatch(rt: Runtime, job_id: uuid.UUID) -> StepResult:
    """Step 3: submit with the submit token stored FIRST, so a retry after an unknown
    outcome or a redelivered message finds the same NVFLARE job instead of a second run."""
    with unit_of_work(rt.sessions) as session:
        job = services.get_job(session, job_id, lock=True)
        if job.state == JobState.ASSIGNED:
            token = job.start_dispatch(rt.clock())
        elif job.state == JobState.DISPATCHING and job.submit_token:
            token = job.submit_token
        else:
            return StepResult(Step.SKIPPED, f"job is {job.state}")
        net_name = job.net_name
        definition = job.definition
    assert net_name is not None

    admin = rt.admin(net_name)
    try:
        folder = materialize(rt.settings, definition, job_id)
        nvflare_job_id = admin.submit(folder, token)  # TransientError -> the task retries
    except (InvalidRequest, JobOutcomeError) as exc:
        # The definition itself is bad: retrying cannot help, and the net is fine.
        with unit_of_work(rt.sessions) as session:
            services.finish_job(session, job_id, JobState.FAILED, f"rejected: {exc}", rt.clock())
        kick(rt)
        return StepResult(Step.GAVE_UP, str(exc))
    except MisconfigurationError as exc:
        net_misconfigured(rt, net_name, job_id, str(exc))
        raise
    try:
        start_time: float | None = admin.server_start_time()
    except TransientError:
        start_time = None  # monitor learns it on its next round

    abort_needed = False
    with unit_of_work(rt.sessions) as session:
        job = services.get_job(session, job_id, lock=True)
        if job.state == JobState.ABORTING:
            # Aborted while the submit was in flight: the run exists now, so stop it.
            job.nvflare_job_id = nvflare_job_id
            abort_needed = True
        elif job.state == JobState.DISPATCHING:
            services.mark_dispatched(session, job_id, nvflare_job_id, start_time, rt.clock())
        elif job.state == JobState.RUNNING:
            pass  # a repeated delivery already recorded it
        else:
            log.warning(
                "submitted a job that moved on meanwhile",
                extra={"job": str(job_id), "state": str(job.state)},
            )
    if abort_needed:
        rt.outbox.send(names.ABORT_ON_SERVER, job_id=str(job_id))
    log.info(
        "job dispatched",
        extra={"job": str(job_id), "net": net_name, "nvflare_job_id": nvflare_job_id},
    )
    return StepResult(Step.DONE, nvflare_job_id)


def requeue_after_transient(rt: Runtime, job_id: uuid.UUID, reason: str) -> bool:
    """A pipeline step ran out of retries on a transient error: requeue, never delete."""
    with unit_of_work(rt.sessions) as session:
        requeued = services.requeue_job(session, job_id, reason, rt.clock())
    kick(rt)
    return requeued


def count_retry(rt: Runtime, job_id: uuid.UUID) -> None:
    """One more transient retry of this job's pipeline (a metric, not a state)."""
    with unit_of_work(rt.sessions) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is not None:
            job.retries += 1

"""Abort: flip-api's request, and the server-side abort of a run. A server that is down,
or that does not know the run, means "nothing to abort"."""

from __future__ import annotations

import logging
import uuid

from app.adapters.nvflare.base import AbortOutcome
from app.db import unit_of_work
from app.errors import (
    DispatcherError,
)
from app.runtime import Runtime
from app.usecases import services
from app.usecases.dispatch import NVFLARE_OUTCOMES
from app.usecases.scaling import kick
from models import JobState

log = logging.getLogger(__name__)


def abort(rt: Runtime, job_id: uuid.UUID, reason: str) -> JobState:
    """flip-api's abort: SQL first; a server abort only if the job may be running there."""
    with unit_of_work(rt.sessions) as session:
        decision = services.abort_job(session, job_id, reason, rt.clock())
    if decision.needs_server_abort:
        return abort_on_server(rt, job_id)
    kick(rt)
    return decision.state


def abort_on_server(rt: Runtime, job_id: uuid.UUID) -> JobState:
    """Abort an ABORTING job's run. A server that is down, or that does not know the job or
    has it not running, means "nothing to abort": ABORTED, net released, no error."""
    with unit_of_work(rt.sessions) as session:
        job = services.get_job(session, job_id)
        if job.state != JobState.ABORTING:
            return job.state
        nvflare_job_id, net_name = job.nvflare_job_id, job.net_name
    if nvflare_job_id is None or net_name is None:
        return JobState.ABORTING  # submit in flight: dispatch() sends the abort when it lands
    result = rt.admin(net_name).abort(nvflare_job_id)
    if result.outcome == AbortOutcome.ALREADY_FINISHED:
        return _settle_finished(rt, job_id, net_name, nvflare_job_id)
    reason = (
        "aborted on the server"
        if result.outcome == AbortOutcome.ABORTED
        else (f"nothing to abort: {result.detail or result.outcome}")
    )
    with unit_of_work(rt.sessions) as session:
        services.finish_job(session, job_id, JobState.ABORTED, reason, rt.clock())
    kick(rt)
    return JobState.ABORTED


def _settle_finished(
    rt: Runtime, job_id: uuid.UUID, net_name: str, nvflare_job_id: str
) -> JobState:
    """The run had already finished when the abort came: record how it finished."""
    try:
        status = rt.admin(net_name).job_status(nvflare_job_id)
    except DispatcherError:
        status = ""
    outcome = NVFLARE_OUTCOMES.get(status, JobState.ABORTED)
    with unit_of_work(rt.sessions) as session:
        services.finish_job(
            session, job_id, outcome, f"finished before abort: {status}", rt.clock()
        )
    kick(rt)
    return outcome

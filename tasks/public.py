"""The tasks flip-api sends by name. Payloads are validated first; an invalid payload is
rejected with a clear error and writes nothing."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from app import names
from app.db import unit_of_work
from app.errors import InvalidRequest
from app.schemas import AbortJob, EnqueueJob, ReportJobStatus
from app.usecases import intake, services
from tasks.base import dispatcher_task, runtime

M = TypeVar("M", bound=BaseModel)


def _validate(model: type[M], payload: Any) -> M:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequest(f"invalid {model.__name__} payload: {problems}") from None


@dispatcher_task(names.ENQUEUE_JOB)
def enqueue_job(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Queue a job (idempotent on caller_key), then try to assign it at once."""
    request = _validate(EnqueueJob, payload)
    result = intake.submit_job(runtime(), request).enqueued
    return {"job_id": str(result.job_id), "created": result.created, "state": result.state}


@dispatcher_task(names.ABORT_JOB)
def abort_job(self: Any, payload: dict[str, Any]) -> str:
    """Abort a job wherever it is; a server that is down means nothing to abort."""
    request = _validate(AbortJob, payload)
    return str(intake.request_abort(runtime(), request.job_id, request.reason).decision.state)


@dispatcher_task(names.REPORT_JOB_STATUS)
def report_job_status(self: Any, payload: dict[str, Any]) -> str:
    """flip-api's terminal-status signal for a job."""
    request = _validate(ReportJobStatus, payload)
    rt = runtime()
    with unit_of_work(rt.sessions) as session:
        state = services.report_job_status(session, request, rt.clock())
    rt.outbox.send(names.ASSIGN_NEXT_JOB)
    return state

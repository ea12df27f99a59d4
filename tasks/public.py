"""The tasks flip-api sends by name. Payloads are validated first; a refused request is
logged as one clear line (no traceback: it is the caller's mistake, not ours), never
retried, and a refused enqueue is recorded so the caller can tell "rejected" from "not yet
processed"."""

from __future__ import annotations

import logging
from typing import Any

from app import names
from app.errors import InvalidRequest, NotFound
from app.schemas import AbortJob, EnqueueJob, ReportJobStatus
from app.usecases import intake
from tasks.base import dispatcher_task, runtime

log = logging.getLogger(__name__)


@dispatcher_task(names.ENQUEUE_JOB, caller_intent=True)
def enqueue_job(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Queue a job (idempotent on caller_key), then try to assign it at once. A refused
    payload is recorded (the caller can see "rejected: <reason>") and logged as one line."""
    rt = runtime()
    try:
        request = intake.parse_payload(EnqueueJob, payload)
        result = intake.submit_job(rt, request).enqueued
    except InvalidRequest as exc:
        key = intake.caller_key_of(payload)
        code = intake.refuse_enqueue(rt, key, exc)
        return {"rejected": str(exc), "reason_code": str(code), "caller_key": key}
    return {"job_id": str(result.job_id), "created": result.created, "state": result.state}


@dispatcher_task(names.ABORT_JOB, caller_intent=True)
def abort_job(self: Any, payload: dict[str, Any]) -> str:
    """Abort a job wherever it is; a server that is down means nothing to abort."""
    try:
        request = intake.parse_payload(AbortJob, payload)
        return str(intake.request_abort(runtime(), request.job_id, request.reason).decision.state)
    except (InvalidRequest, NotFound) as exc:
        log.warning("abort rejected: %s", exc)
        return f"rejected: {exc}"


@dispatcher_task(names.REPORT_JOB_STATUS, caller_intent=True)
def report_job_status(self: Any, payload: dict[str, Any]) -> str:
    """flip-api's terminal-status signal for a job."""
    rt = runtime()
    try:
        request = intake.parse_payload(ReportJobStatus, payload)
        return str(intake.report_status(rt, request))
    except (InvalidRequest, NotFound) as exc:
        log.warning("status report rejected: %s", exc)
        return f"rejected: {exc}"

"""flip-api's requests as they arrive over the broker: each payload is validated, then acted
on through its use case, or refused: a refusal is logged as one clear line (no traceback:
it is the caller's mistake, not ours), never retried, and a refused enqueue or prewarm is
recorded so the caller can tell "rejected" from "not yet processed". What each returns is
the task's result (JSON), shown in Flower."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from app.errors import InvalidRequest, NotFound
from app.runtime import Runtime
from app.schemas import (
    AbortJob,
    CancelPrewarm,
    EnqueueJob,
    PrewarmNet,
    ReportedStatus,
    ReportJobStatus,
)
from app.usecases import intake, prewarm, records
from models import ReasonCode

log = logging.getLogger(__name__)


def enqueue_job(rt: Runtime, payload: Any, message_id: str | None = None) -> dict[str, Any]:
    """Queue a job (idempotent on caller_key), then kick the assigner; a refused payload is
    recorded with its reason code (`caller_key_conflict` or `rejected`), once per request:
    `message_id` is the broker's id for the message, the same for every copy of it (its
    retries, redeliveries, publish duplicates), and a copy of a refused message is answered
    with that refusal, whatever it reads as now; a request accepted between its judgement
    here and the refusal's record (another copy, judged once the upload showed up) is
    answered with its job, and nothing is refused."""
    key = intake.caller_key_of(payload)
    try:
        request = intake.parse_payload(EnqueueJob, payload)
        result = intake.submit_job(rt, request, message_id=message_id).enqueued
    except intake.RefusedBefore as refused:
        # Its row may have been pruned since (past REJECTED_RETENTION_S): refused all the same.
        reason, code = intake.refusal_of_message(rt, message_id) or (
            str(refused),
            ReasonCode.REJECTED,
        )
        return {"rejected": reason, "reason_code": str(code), "caller_key": key}
    except InvalidRequest as exc:
        refusal = intake.refuse_enqueue(rt, payload, exc, message_id)
        if not isinstance(refusal, ReasonCode):
            result = refusal  # the same request became a job since it was judged: that job
        else:
            return {"rejected": str(exc), "reason_code": str(refusal), "caller_key": key}
    return {"job_id": str(result.job_id), "created": result.created, "state": result.state}


def abort_job(rt: Runtime, payload: Any) -> str:
    """Abort a job wherever it is; a server that is down means nothing to abort. An abort
    for a job id not stored yet is kept for the enqueue that may still come (its answer says
    "rejected: ... not found", and until when it is kept)."""
    try:
        request = intake.parse_payload(AbortJob, payload)
        while True:
            try:
                return str(intake.request_abort(rt, request.job_id, request.reason).decision.state)
            except NotFound as exc:
                kept = intake.keep_early_abort(rt, request.job_id, request.reason)
                if kept is not None:
                    return _kept("abort rejected", exc, kept)
                # Its enqueue committed since the look: abort the job as any.
    except InvalidRequest as exc:
        log.warning("abort rejected: %s", exc)
        return f"rejected: {exc}"


def report_job_status(rt: Runtime, payload: Any) -> str:
    """flip-api's terminal-status signal for a job; `stopped` for a job id not stored yet is
    kept like an abort (`abort_job`), any other report for it is refused."""
    try:
        request = intake.parse_payload(ReportJobStatus, payload)
        while True:
            try:
                return str(intake.report_status(rt, request))
            except NotFound as exc:
                if request.status != ReportedStatus.STOPPED:
                    raise
                reason = records.reported_reason(request)
                code = ReasonCode.REPORTED_STOPPED
                kept = intake.keep_early_abort(rt, request.job_id, reason, code)
                if kept is not None:
                    return _kept("status report rejected", exc, kept)
    except (InvalidRequest, NotFound) as exc:
        log.warning("status report rejected: %s", exc)
        return f"rejected: {exc}"


def _kept(what: str, exc: NotFound, until: datetime) -> str:
    """The answer to an abort kept for its job (tasks/README.md): "not found", as before,
    and until when an enqueue of that job is aborted as it is stored."""
    kept = f"the abort is kept until {until.isoformat()} for an enqueue of this job"
    log.warning("%s: %s; %s", what, exc, kept)
    return f"rejected: {exc}; {kept}"


def prewarm_net(rt: Runtime, payload: Any) -> dict[str, Any]:
    """Hold the net a job is likely to need ready for `within_s` seconds (idempotent on
    caller_key); a refusal is recorded with its reason code and returned."""
    try:
        request = intake.parse_payload(PrewarmNet, payload)
    except InvalidRequest as exc:
        key = intake.caller_key_of(payload)
        code = prewarm.refuse_prewarm(rt, key, exc)
        return {"refused": str(exc), "reason_code": str(code), "caller_key": key}
    try:
        requested = prewarm.request_prewarm(rt, request)
    except InvalidRequest as exc:  # recorded by the use case
        code = prewarm.refusal_code(exc)
        return {"refused": str(exc), "reason_code": str(code), "caller_key": request.caller_key}
    return requested.prewarm.model_dump(mode="json") | {"created": requested.created}


def cancel_prewarm(rt: Runtime, payload: Any) -> dict[str, Any]:
    """End a prewarm's hold now; the net's idle grace starts. A cancel for a key no prewarm
    has yet (accepted or refused) is kept for the prewarm that may still come
    (`prewarm.early_cancels`): its answer is `rejected`, as before, and says until when."""
    try:
        request = intake.parse_payload(CancelPrewarm, payload)
        view = prewarm.cancel_prewarm(rt, request.caller_key, keep=True)
        return view.model_dump(mode="json")
    except (InvalidRequest, NotFound) as exc:
        log.warning("prewarm cancel rejected: %s", exc)
        return {"rejected": str(exc)}

"""A small typed client for flip-api: sends the public tasks by name, so the caller needs
no worker code, and validates payloads before they leave (the worker validates again).

    client = DispatcherClient("redis://redis:6379/0")
    job_id = client.enqueue_job(EnqueueJob(caller_key="flip-123", definition="fedavg-ct",
                                           net="net-1"))
    client.abort_job(job_id)
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from celery import Celery

from app.names import ABORT_JOB, CANCEL_PREWARM, ENQUEUE_JOB, PREWARM, QUEUE, REPORT_JOB_STATUS
from app.schemas import (
    AbortJob,
    CancelPrewarm,
    EnqueueJob,
    PrewarmNet,
    ReportedStatus,
    ReportJobStatus,
    job_id_for,
)


class DispatcherClient:
    """Sends flip-api's tasks; no result backend is needed (see `job_id_for`)."""

    def __init__(self, broker_url: str, *, app: Celery | None = None) -> None:
        self.app = app or Celery("fl_dispatcher_client", broker=broker_url)
        self.app.conf.update(task_serializer="json", accept_content=["json"])

    def _send(self, name: str, payload: dict[str, Any]) -> None:
        headers = trace_headers() or None
        self.app.send_task(name, kwargs={"payload": payload}, queue=QUEUE, headers=headers)

    def enqueue_job(self, request: EnqueueJob) -> uuid.UUID:
        """Queue a job; returns its id (derived from caller_key, so a repeat is harmless).
        A job that names no prewarm, or no `project_id`, is sent without the field, as
        before it existed, so a worker older than it still takes the payload."""
        payload = request.model_dump(mode="json")
        for optional in ("prewarm_key", "project_id"):
            if payload[optional] is None:
                del payload[optional]
        self._send(ENQUEUE_JOB, payload)
        return job_id_for(request.caller_key)

    def abort_job(self, job_id: uuid.UUID, reason: str = "aborted by caller") -> None:
        """Abort a job; a server that is down means nothing to abort, never an error."""
        self._send(ABORT_JOB, AbortJob(job_id=job_id, reason=reason).model_dump(mode="json"))

    def report_job_status(
        self, job_id: uuid.UUID, status: ReportedStatus, detail: str = ""
    ) -> None:
        """flip-api's terminal-status signal (results uploaded / error / stopped)."""
        payload = ReportJobStatus(job_id=job_id, status=status, detail=detail)
        self._send(REPORT_JOB_STATUS, payload.model_dump(mode="json"))

    def prewarm(self, request: PrewarmNet) -> None:
        """Say a job is likely within `request.within_s`: its net's server is brought up and
        held ready until then (idempotent on caller_key; tasks/README.md "Prewarm")."""
        self._send(PREWARM, request.model_dump(mode="json"))

    def cancel_prewarm(self, caller_key: str) -> None:
        """End a prewarm's hold now (the net's idle grace starts)."""
        self._send(CANCEL_PREWARM, CancelPrewarm(caller_key=caller_key).model_dump(mode="json"))

    def close(self) -> None:
        """Release the broker connection pool."""
        self.app.close()


def trace_headers() -> dict[str, str]:
    """The caller's current trace context as task headers (W3C `traceparent`, and
    `tracestate`/`baggage` as its propagators write them), so the job's trace continues
    the caller's: empty when the caller has no OpenTelemetry loaded or no current span.
    This client never loads OpenTelemetry itself."""
    if "opentelemetry.trace" not in sys.modules:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier

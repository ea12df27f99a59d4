"""Delivery of job status callbacks: sent after every commit that moved a job, and by beat
as a sweep, so an event whose message was lost is still delivered."""

from __future__ import annotations

from typing import Any

from app import names
from app.usecases import callbacks
from tasks.base import dispatcher_task, runtime


@dispatcher_task(names.DELIVER_CALLBACKS, housekeeping=True)
def deliver_callbacks(self: Any) -> dict[str, Any]:
    """Deliver every due event in order; come back when the next one is due (the use case
    lets exactly one pending task schedule that)."""
    report = callbacks.deliver_callbacks(runtime())
    if report.retry_in_s is not None:
        raise self.retry(countdown=report.retry_in_s, max_retries=None)
    return {"delivered": report.delivered, "failed": report.failed, "busy": report.busy}

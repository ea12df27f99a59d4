"""Beat's tasks: each finds due or stuck work and acts on it through one use case."""

from __future__ import annotations

from typing import Any

from app.celery_app import HOUSEKEEPING_HARD_LIMIT_S, HOUSEKEEPING_SOFT_LIMIT_S
from app.usecases import dispatch as pipeline
from tasks.base import dispatcher_task, runtime


@dispatcher_task(
    "scale_down_idle_nets",
    soft_time_limit=HOUSEKEEPING_SOFT_LIMIT_S,
    time_limit=HOUSEKEEPING_HARD_LIMIT_S,
)
def scale_down_idle_nets(self: Any) -> list[str]:
    """Scale nets idle past their grace to zero."""
    return pipeline.scale_down_idle_nets(runtime())


@dispatcher_task(
    "keep_alive_busy_nets",
    soft_time_limit=HOUSEKEEPING_SOFT_LIMIT_S,
    time_limit=HOUSEKEEPING_HARD_LIMIT_S,
)
def keep_alive_busy_nets(self: Any) -> list[str]:
    """Ping BUSY nets only."""
    return pipeline.keep_alive_busy_nets(runtime())


@dispatcher_task(
    "monitor_running_jobs",
    soft_time_limit=HOUSEKEEPING_SOFT_LIMIT_S,
    time_limit=HOUSEKEEPING_HARD_LIMIT_S,
)
def monitor_running_jobs(self: Any) -> dict[str, str]:
    """Settle finished or lost runs."""
    return pipeline.monitor_running_jobs(runtime())


@dispatcher_task(
    "reconcile", soft_time_limit=HOUSEKEEPING_SOFT_LIMIT_S, time_limit=HOUSEKEEPING_HARD_LIMIT_S
)
def reconcile(self: Any) -> dict[str, list[str]]:
    """Re-drive stuck work and repair drift."""
    result = pipeline.reconcile(runtime())
    return {"redriven": list(result.redriven), "repaired": list(result.repaired)}

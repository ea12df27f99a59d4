"""Beat's tasks: each finds due or stuck work and acts on it through one use case."""

from __future__ import annotations

from typing import Any

from app import names
from app.usecases import monitor, reconciler, scale_down
from tasks.base import dispatcher_task, runtime


@dispatcher_task(names.SCALE_DOWN_IDLE_NETS, housekeeping=True)
def scale_down_idle_nets(self: Any) -> list[str]:
    """Scale nets idle past their grace to zero."""
    return scale_down.scale_down_idle_nets(runtime())


@dispatcher_task(names.KEEP_ALIVE_BUSY_NETS, housekeeping=True)
def keep_alive_busy_nets(self: Any) -> list[str]:
    """Ping BUSY nets only."""
    return scale_down.keep_alive_busy_nets(runtime())


@dispatcher_task(names.MONITOR_RUNNING_JOBS, housekeeping=True)
def monitor_running_jobs(self: Any) -> dict[str, str]:
    """Settle finished or lost runs."""
    return monitor.monitor_running_jobs(runtime())


# No task events: a poll a second would crowd the job chains out of Flower's task list (it
# keeps the newest 100,000: a day of polls); what it settles shows in the jobs' history.
@dispatcher_task(names.MONITOR_AWAITED_RUNS, housekeeping=True, send_events=False)
def monitor_awaited_runs(self: Any) -> dict[str, str]:
    """Settle the runs a QUEUED job waits for, soon after they end."""
    return monitor.monitor_awaited_runs(runtime())


@dispatcher_task(names.RECONCILE, housekeeping=True)
def reconcile(self: Any) -> dict[str, list[str]]:
    """Re-drive stuck work and repair drift."""
    rt = runtime()
    # One observation pass: the nets' drivers are read in batches (ECS: 10 services a call).
    with rt.observation_pass():
        result = reconciler.reconcile(rt)
    return {"redriven": list(result.redriven), "repaired": list(result.repaired)}

"""What the fast clock reads from the world between two steps (app.sim.fast_forward): which
beat loops have anything to do now, and when the world next changes by itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from app import names


@dataclass
class Calm:
    """fast_forward's reading of the world between two steps."""

    in_flight: bool = False  # a pipeline, abort, stray, start, stop or message under way
    assign_due: bool = False  # a QUEUED job and a free net it may take
    monitor_due: bool = False  # a run ended, or a job outlived MAX_RUN_S, or a report wait
    awaited_due: bool = False  # monitor_due for a net a QUEUED job could take
    scale_down_due: bool = False  # an idle net past its grace
    reconcile_due: bool = False  # a net to settle, or a job or start past STUCK_AFTER_S
    times: list[float] = field(default_factory=list)  # when the world changes by itself

    def needs(self, task: str) -> bool:
        """Whether a beat loop has anything to do now (keep-alive only pings: always)."""
        if task == names.ASSIGN_NEXT_JOB:
            return self.assign_due
        if task == names.SCALE_DOWN_IDLE_NETS:
            return self.scale_down_due
        if task == names.MONITOR_RUNNING_JOBS:
            return self.monitor_due
        if task == names.MONITOR_AWAITED_RUNS:
            return self.awaited_due
        if task == names.RECONCILE:
            return self.reconcile_due
        return True

    def quiet_until(self, now: float) -> float | None:
        """When nothing is due: the world's next change (None: something is due, or
        nothing will ever change by itself)."""
        if self.in_flight or self.assign_due or self.monitor_due or self.scale_down_due:
            return None
        if self.reconcile_due:
            return None
        until = min(self.times, default=None)
        return until if until is not None and until > now else None

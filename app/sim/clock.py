"""The simulated clock: seconds since the simulation's epoch, read as UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
# NVFLARE reports its start time in epoch seconds; the fake servers use this base.
EPOCH_S = EPOCH.timestamp()


class SimClock:
    """`Runtime.clock`: never reads the wall clock; only the simulation moves it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> datetime:
        return EPOCH + timedelta(seconds=self.t)

    def advance_to(self, t: float) -> None:
        """Move to `t` (never backwards)."""
        self.t = max(self.t, t)

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


def seconds_of(value: datetime) -> float:
    """A datetime from the database as simulation seconds."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - EPOCH).total_seconds()


class ProcessClock:
    """One worker process's `Runtime.clock`: the simulated time plus its own offset, which
    a clock step (an NTP step, a VM resumed) moves forwards or backwards and a later step
    puts back. Celery's expiry and every timestamp the process writes follow it."""

    def __init__(self, base: SimClock) -> None:
        self.base = base
        self.offset = 0.0

    def __call__(self) -> datetime:
        return self.base() + timedelta(seconds=self.offset)

    @property
    def t(self) -> float:
        """The process's reading in simulation seconds."""
        return self.base.t + self.offset

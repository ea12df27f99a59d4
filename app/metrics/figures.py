"""What the metrics are made of: histogram buckets, a scrape's `Snapshot`, the keys of
the running totals, and the pure computations over history rows (cold starts, uptimes,
dispatch latencies) that the fold and tests/metrics_reference.py share."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy import Table

from models import Base, JobEvent, JobState, NetState

# Bucket bounds (seconds). Queue waits range from instant to hours behind a long job; a
# cold start is an ECS task launch plus NVFLARE start plus sites reconnecting (minutes).
QUEUE_WAIT_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
COLD_START_BUCKETS_S = (5, 10, 30, 60, 90, 120, 180, 300, 600, 900, 1800)
DISPATCH_LATENCY_BUCKETS_S = (1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800)

_US = timedelta(microseconds=1)

# metric_totals keys: (metric, labels). Histograms keep one row per bucket (labels: the
# bucket's upper bound, "+Inf" for the last) and "<name>_sum_us".
QUEUE_WAIT = "queue_wait"
COLD_START = "cold_start"
DISPATCH_LATENCY = "dispatch_latency"
JOBS_FINISHED = "jobs_finished"
SCALE_EVENTS = "scale_events"
JOB_RETRIES = "job_retries"
JOB_REQUEUES = "job_requeues"
REPORT_TIMEOUTS = "report_timeouts"
PREWARMS = "prewarms"  # labels: the outcome (models.prewarms.PrewarmOutcome)
# Rejected events given up whose rows were pruned: the failed-events counter reads the rows
# still kept plus this, so pruning one never lowers it (app.usecases.enqueue.record_rejection).
CALLBACK_FAILED_PRUNED = "callback_failed_pruned"

# The outcome label of a scale decision is its class, a closed set: the driver's own words
# (any length, any script) stay in scale_events.outcome, the log and the net's last_error.
# Free text as a label would grow the series without bound and, escaped to JSON, overflow
# metric_totals.labels.
SCALE_OUTCOMES = ("ok", "error", "misconfigured")


def scale_outcome_class(outcome: str) -> str:
    """The /metrics label of a recorded scale outcome: `ok`, `misconfigured` or `error`."""
    kind = outcome.split(":", 1)[0]
    return kind if kind in SCALE_OUTCOMES else "error"


def table_of(model: type[Base]) -> Table:
    """The Core table of a model (the fold works on tables, not on ORM objects)."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


def micros_between(start: datetime, end: datetime) -> int:
    """Whole microseconds from start to end, never negative (timestamps are microseconds)."""
    return max(0, (end - start) // _US)


def seconds_between(start: datetime, end: datetime) -> float:
    """`micros_between` in seconds."""
    return micros_between(start, end) / 1e6


@dataclass
class Histogram:
    """Observations by bucket upper bound (math.inf: above the last bound) and their sum."""

    counts: dict[float, int] = field(default_factory=dict)
    sum_us: int = 0

    @classmethod
    def of(cls, values_s: Iterable[float], bounds: Sequence[float]) -> Histogram:
        """The histogram of these values (seconds)."""
        hist = cls()
        for value in values_s:
            bound = bucket_bound(value, bounds)
            hist.counts[bound] = hist.counts.get(bound, 0) + 1
            hist.sum_us += round(value * 1e6)
        return hist

    @property
    def count(self) -> int:
        return sum(self.counts.values())


def bucket_bound(value_s: float, bounds: Sequence[float]) -> float:
    """The upper bound of the first bucket that holds the value (math.inf past the last)."""
    return next((float(b) for b in bounds if value_s <= b), math.inf)


@dataclass
class Snapshot:
    """Everything the metrics say at one scrape."""

    jobs_by_state: dict[JobState, int] = field(default_factory=dict)
    net_states: dict[str, NetState] = field(default_factory=dict)
    queue_wait: Histogram = field(default_factory=Histogram)
    oldest_queued_s: float = 0.0
    cold_start: Histogram = field(default_factory=Histogram)
    dispatch_latency: Histogram = field(default_factory=Histogram)
    scale_events: dict[tuple[str, str, str], int] = field(default_factory=dict)
    uptime_s: dict[str, float] = field(default_factory=dict)
    job_retries: int = 0
    job_requeues: int = 0
    stray_runs: dict[str, int] = field(default_factory=dict)
    report_timeouts: int = 0
    # Status callbacks (all zero while CALLBACK_URL is unset).
    callback_undelivered: int = 0
    callback_oldest_undelivered_s: float = 0.0
    callback_failed: int = 0
    # Seconds each READY net has been without a job (0 when not idle), and the grace of each
    # scale-to-zero net (always-on nets have none): a server up past it has been forgotten.
    idle_s: dict[str, float] = field(default_factory=dict)
    idle_grace_s: dict[str, float] = field(default_factory=dict)
    # Unix time each beat loop last finished a round (housekeeping_runs).
    housekeeping_last_run: dict[str, float] = field(default_factory=dict)
    # Prewarms that ended (or were refused), by outcome; nets a live prewarm holds now.
    prewarms: dict[str, int] = field(default_factory=dict)
    prewarm_held_nets: int = 0


class _Move(Protocol):
    net_name: str
    from_state: NetState | None
    to_state: NetState
    at: datetime


@dataclass
class NetClock:
    """What the metrics keep of one net's history between folds: when it last entered
    STARTING (for the next cold start), since when it is out of STOPPED, and its uptime."""

    starting_since: datetime | None = None
    up_since: datetime | None = None
    uptime_us: int = 0

    def apply(self, from_state: NetState | None, to_state: NetState, at: datetime) -> int | None:
        """Fold one move (in the net's order); returns a cold start (us) if it ends one:
        READY reached from STARTING pairs with the latest move into STARTING (a STARTING ->
        UNHEALTHY -> STARTING retry restarts the clock). Time out of STOPPED adds to the
        uptime; time before a net's first recorded move is unknown and not counted."""
        if self.up_since is not None:
            self.uptime_us += micros_between(self.up_since, at)
        self.up_since = None if to_state == NetState.STOPPED else at
        if to_state == NetState.STARTING:
            self.starting_since = at
        elif to_state == NetState.READY and from_state == NetState.STARTING:
            since, self.starting_since = self.starting_since, None
            if since is not None:
                return micros_between(since, at)
        return None

    def uptime_s(self, now: datetime) -> float:
        """Seconds out of STOPPED up to `now` (a net up now counts to now)."""
        running = micros_between(self.up_since, now) if self.up_since is not None else 0
        return (self.uptime_us + running) / 1e6


def cold_starts(events: Iterable[_Move]) -> list[float]:
    """STARTING -> READY durations (see NetClock.apply); `events` ordered by net, then time."""
    clocks: dict[str, NetClock] = defaultdict(NetClock)
    durations = []
    for event in events:
        cold_us = clocks[event.net_name].apply(event.from_state, event.to_state, event.at)
        if cold_us is not None:
            durations.append(cold_us / 1e6)
    return durations


def uptimes(events: Iterable[_Move], now: datetime) -> dict[str, float]:
    """Seconds each net spent out of STOPPED, from its history; a net up now counts to `now`.
    Time before a net's first recorded move is unknown and not counted. `events` must be
    ordered by net, then time."""
    clocks: dict[str, NetClock] = defaultdict(NetClock)
    for event in events:
        clocks[event.net_name].apply(event.from_state, event.to_state, event.at)
    return {name: clock.uptime_s(now) for name, clock in clocks.items()}


def dispatch_latencies(events: Iterable[JobEvent]) -> list[float]:
    """ASSIGNED -> RUNNING durations: RUNNING is only reachable through the same attempt's
    ASSIGNED -> DISPATCHING, so each RUNNING pairs with the job's latest ASSIGNED. `events`
    must be ordered by job, then time."""
    assigned: dict[object, datetime] = {}
    durations = []
    for event in events:
        if event.to_state == JobState.ASSIGNED:
            assigned[event.job_id] = event.at
        elif event.to_state == JobState.RUNNING:
            since = assigned.pop(event.job_id, None)
            if since is not None:
                durations.append(seconds_between(since, event.at))
    return durations

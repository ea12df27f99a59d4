"""Prometheus metrics computed from SQL at scrape time.

Workers, beat and the API are separate processes (and a worker has several children), so
in-process counters would each see a slice. The tables are the one shared record: every
transition writes a history row, so the collector derives counts and durations from them
when Prometheus scrapes, and any API replica answers the same numbers.

Counters here are sums over rows; if history is ever pruned they can go down, which
Prometheus treats as a counter reset.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.usecases import callbacks as callbacks_uc
from app.usecases.services import REPORT_TIMEOUT_REASON
from models import Job, JobEvent, JobState, Net, NetEvent, NetState, ScaleEvent, StrayRun

# Bucket bounds (seconds). Queue waits range from instant to hours behind a long job; a
# cold start is an ECS task launch plus NVFLARE start plus sites reconnecting (minutes).
QUEUE_WAIT_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
COLD_START_BUCKETS_S = (5, 10, 30, 60, 90, 120, 180, 300, 600, 900, 1800)
DISPATCH_LATENCY_BUCKETS_S = (1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800)


@dataclass
class Snapshot:
    """Everything the metrics say, read from SQL in one session."""

    jobs_by_state: dict[JobState, int] = field(default_factory=dict)
    net_states: dict[str, NetState] = field(default_factory=dict)
    queue_waits_s: list[float] = field(default_factory=list)
    oldest_queued_s: float = 0.0
    cold_starts_s: list[float] = field(default_factory=list)
    dispatch_latencies_s: list[float] = field(default_factory=list)
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


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def cold_starts(events: Iterable[NetEvent]) -> list[float]:
    """STARTING -> READY durations: each READY reached from STARTING pairs with the net's
    latest move into STARTING (a STARTING -> UNHEALTHY -> STARTING retry restarts the clock).
    `events` must be ordered by net, then time."""
    started: dict[str, datetime] = {}
    durations = []
    for event in events:
        if event.to_state == NetState.STARTING:
            started[event.net_name] = event.at
        elif event.to_state == NetState.READY and event.from_state == NetState.STARTING:
            since = started.pop(event.net_name, None)
            if since is not None:
                durations.append(_seconds(since, event.at))
    return durations


def uptimes(events: Iterable[NetEvent], now: datetime) -> dict[str, float]:
    """Seconds each net spent out of STOPPED, from its history; a net up now counts to `now`.
    Time before a net's first recorded move is unknown and not counted. `events` must be
    ordered by net, then time."""
    total: dict[str, float] = defaultdict(float)
    up_since: dict[str, datetime | None] = {}
    for event in events:
        since = up_since.get(event.net_name)
        if since is not None:
            total[event.net_name] += _seconds(since, event.at)
        up_since[event.net_name] = None if event.to_state == NetState.STOPPED else event.at
    for name, since in up_since.items():
        total[name] += _seconds(since, now) if since is not None else 0.0
    return dict(total)


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
                durations.append(_seconds(since, event.at))
    return durations


def read_snapshot(session: Session, now: datetime, *, callbacks: bool = False) -> Snapshot:
    """Read the metrics from the tables (a few aggregate queries and the event histories);
    `callbacks`: CALLBACK_URL is set, so the delivery backlog means something."""
    snap = Snapshot()
    if callbacks:
        backlog = callbacks_uc.backlog(session)
        snap.callback_undelivered = backlog.undelivered
        snap.callback_failed = backlog.failed
        if backlog.oldest_undelivered_at is not None:
            snap.callback_oldest_undelivered_s = _seconds(backlog.oldest_undelivered_at, now)
    for state, count in session.execute(select(Job.state, func.count()).group_by(Job.state)):
        snap.jobs_by_state[JobState(state)] = int(count)
    snap.net_states = {
        name: NetState(state) for name, state in session.execute(select(Net.name, Net.state))
    }
    for created, assigned in session.execute(
        select(Job.created_at, Job.assigned_at).where(Job.assigned_at.is_not(None))
    ):
        if assigned is not None:  # the WHERE says so; this tells the type checker
            snap.queue_waits_s.append(_seconds(created, assigned))
    oldest = session.scalar(select(func.min(Job.created_at)).where(Job.state == JobState.QUEUED))
    snap.oldest_queued_s = _seconds(oldest, now) if oldest is not None else 0.0

    net_events = session.scalars(
        select(NetEvent).order_by(NetEvent.net_name, NetEvent.at, NetEvent.id)
    ).all()
    snap.cold_starts_s = cold_starts(net_events)
    snap.uptime_s = uptimes(net_events, now)
    for name in snap.net_states:
        snap.uptime_s.setdefault(name, 0.0)

    job_events = session.scalars(
        select(JobEvent)
        .where(JobEvent.to_state.in_((JobState.ASSIGNED, JobState.RUNNING)))
        .order_by(JobEvent.job_id, JobEvent.at, JobEvent.id)
    ).all()
    snap.dispatch_latencies_s = dispatch_latencies(job_events)

    for net, action, outcome, count in session.execute(
        select(ScaleEvent.net_name, ScaleEvent.action, ScaleEvent.outcome, func.count()).group_by(
            ScaleEvent.net_name, ScaleEvent.action, ScaleEvent.outcome
        )
    ):
        snap.scale_events[(net, action, outcome)] = int(count)
    for net_name, count in session.execute(
        select(StrayRun.net_name, func.count()).group_by(StrayRun.net_name)
    ):
        snap.stray_runs[net_name] = int(count)
    snap.report_timeouts = int(
        session.scalar(
            select(func.count())
            .select_from(JobEvent)
            .where(
                JobEvent.from_state == JobState.FINISHING,
                JobEvent.reason.like(f"{REPORT_TIMEOUT_REASON}%"),
            )
        )
        or 0
    )
    snap.job_retries = int(session.scalar(select(func.coalesce(func.sum(Job.retries), 0))) or 0)
    snap.job_requeues = int(
        session.scalar(
            select(func.count())
            .select_from(JobEvent)
            .where(JobEvent.to_state == JobState.QUEUED, JobEvent.from_state.is_not(None))
        )
        or 0
    )
    return snap


def _histogram(
    name: str, documentation: str, values: Sequence[float], bounds: Sequence[float]
) -> HistogramMetricFamily:
    counts = Counter[int]()
    for value in values:
        # Index of the first bucket that holds the value; len(bounds) means +Inf only.
        counts[next((i for i, b in enumerate(bounds) if value <= b), len(bounds))] += 1
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for i, bound in enumerate(bounds):
        cumulative += counts[i]
        buckets.append((str(float(bound)), cumulative))
    buckets.append(("+Inf", len(values)))
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=sum(values))


def families(snap: Snapshot) -> list[Metric]:
    """The metric families for one snapshot (every job and net state appears, zero or not)."""
    jobs = GaugeMetricFamily("fl_dispatcher_jobs", "Jobs by state.", labels=["state"])
    for job_state in JobState:
        jobs.add_metric([job_state.value], snap.jobs_by_state.get(job_state, 0))

    nets = GaugeMetricFamily(
        "fl_dispatcher_nets",
        "1 for each net's current state, 0 otherwise.",
        labels=["net", "state"],
    )
    for net, current in sorted(snap.net_states.items()):
        for net_state in NetState:
            nets.add_metric([net, net_state.value], 1 if net_state == current else 0)

    scale = CounterMetricFamily(
        "fl_dispatcher_scale_events",
        "Scale decisions by net, action (scale_up, scale_down) and outcome (ok or the error).",
        labels=["net", "action", "outcome"],
    )
    for (net, action, outcome), count in sorted(snap.scale_events.items()):
        scale.add_metric([net, action, outcome], count)

    uptime = CounterMetricFamily(
        "fl_dispatcher_server_uptime_seconds",
        "Seconds each net's server spent out of STOPPED (from net_events; up now counts to now).",
        labels=["net"],
    )
    for net, seconds in sorted(snap.uptime_s.items()):
        uptime.add_metric([net], seconds)

    return [
        jobs,
        nets,
        _histogram(
            "fl_dispatcher_queue_wait_seconds",
            "Seconds from enqueue to the (latest) assignment of each assigned job.",
            snap.queue_waits_s,
            QUEUE_WAIT_BUCKETS_S,
        ),
        GaugeMetricFamily(
            "fl_dispatcher_oldest_queued_job_age_seconds",
            "Age of the oldest QUEUED job (0 when the queue is empty).",
            value=snap.oldest_queued_s,
        ),
        _histogram(
            "fl_dispatcher_cold_start_seconds",
            "Seconds from a net entering STARTING to READY (net_events).",
            snap.cold_starts_s,
            COLD_START_BUCKETS_S,
        ),
        _histogram(
            "fl_dispatcher_dispatch_latency_seconds",
            "Seconds from a job's ASSIGNED to RUNNING (job_events), per attempt.",
            snap.dispatch_latencies_s,
            DISPATCH_LATENCY_BUCKETS_S,
        ),
        scale,
        uptime,
        CounterMetricFamily(
            "fl_dispatcher_job_retries",
            "Transient-error retries of pipeline steps, summed over jobs.",
            value=snap.job_retries,
        ),
        CounterMetricFamily(
            "fl_dispatcher_job_requeues",
            "Moves of a job back into QUEUED (job_events).",
            value=snap.job_requeues,
        ),
        _stray_runs(snap),
        CounterMetricFamily(
            "fl_dispatcher_report_timeouts",
            "FINISHING jobs settled because flip-api's results report never came.",
            value=snap.report_timeouts,
        ),
        GaugeMetricFamily(
            "fl_dispatcher_callback_undelivered_events",
            "Job events not yet delivered to CALLBACK_URL (0 while callbacks are off).",
            value=snap.callback_undelivered,
        ),
        GaugeMetricFamily(
            "fl_dispatcher_callback_oldest_undelivered_seconds",
            "Age of the oldest job event not yet delivered (0 when none).",
            value=snap.callback_oldest_undelivered_s,
        ),
        CounterMetricFamily(
            "fl_dispatcher_callback_failed_events",
            "Job events the receiver rejected CALLBACK_MAX_4XX_TRIES times (given up).",
            value=snap.callback_failed,
        ),
    ]


def _stray_runs(snap: Snapshot) -> Metric:
    family = GaugeMetricFamily(
        "fl_dispatcher_stray_runs",
        "Runs a net's server may hold that no job counts; the net takes no job until 0.",
        labels=["net"],
    )
    for net in sorted(snap.net_states):
        family.add_metric([net], snap.stray_runs.get(net, 0))
    return family


class SqlCollector:
    """A prometheus_client collector that reads a snapshot from SQL on every scrape."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Callable[[], datetime],
        *,
        callbacks: bool = False,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._callbacks = callbacks

    def collect(self) -> Iterator[Metric]:
        with self._sessions() as session:
            snap = read_snapshot(session, self._clock(), callbacks=self._callbacks)
        yield from families(snap)


def build_registry(
    sessions: sessionmaker[Session], clock: Callable[[], datetime], *, callbacks: bool = False
) -> CollectorRegistry:
    """A registry holding only the SQL collector (its own, so several apps in one process,
    as in tests, never clash on the global registry)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SqlCollector(sessions, clock, callbacks=callbacks))
    return registry

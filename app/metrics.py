"""Prometheus metrics from SQL, at a cost that follows the active work, not the history.

Workers, beat and the API are separate processes (and a worker has several children), so
in-process counters would each see a slice. The tables are the one shared record, and any
API replica answers the same numbers. Two kinds of figures come out of them:

- the current state (unfinished jobs by state, nets by state, the oldest queued job, stray
  runs) is read from the tables at scrape time: those rows are the active work, found by
  index;
- everything the history says (finished jobs, the three histograms, scale events, server
  uptime, retries, requeues, report timeouts) is kept as running totals (`metric_totals`,
  and one `metric_net_clocks` row per net). Every scrape first folds in the history written
  since the previous one: a history row not yet counted has `counted = false` (a partial
  index finds those), and is marked counted in the same transaction that adds it to the
  totals. So each row is counted exactly once, whatever commits late, whichever replica
  scrapes and however a scrape ends, and a scrape costs the rows written since the last one.
  Jobs' `retries` (a number updated in place) are folded the same way through
  `retries_counted`.

The figures mean exactly what a full scan of the tables would say (tests/metrics_reference.py
is that scan; a test and the scrape benchmark compare the two). Pruning history no longer
lowers a counter. `catch_up` folds a long backlog in batches (`fl-dispatcher db upgrade` runs
it, so the first scrape after the upgrade that added the totals is not the one to pay).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from sqlalchemy import ColumnElement, Table, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from app.db import unit_of_work
from app.usecases import callbacks as callbacks_uc
from app.usecases import prewarm as prewarm_uc
from app.usecases.services import REPORT_TIMEOUT_REASON
from models import (
    TERMINAL_JOB_STATES,
    Base,
    HousekeepingRun,
    Job,
    JobEvent,
    JobState,
    MetricNetClock,
    MetricTotal,
    Net,
    NetEvent,
    NetState,
    Prewarm,
    PrewarmOutcome,
    ScaleEvent,
    StrayRun,
)

# Bucket bounds (seconds). Queue waits range from instant to hours behind a long job; a
# cold start is an ECS task launch plus NVFLARE start plus sites reconnecting (minutes).
QUEUE_WAIT_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
COLD_START_BUCKETS_S = (5, 10, 30, 60, 90, 120, 180, 300, 600, 900, 1800)
DISPATCH_LATENCY_BUCKETS_S = (1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800)

# History rows folded per table and scrape: bounds one scrape after a long pause; a longer
# backlog is folded by the following scrapes (or by `catch_up`).
FOLD_BATCH = 20_000
# Folds are serialised (PostgreSQL: this advisory lock; SQLite: the write lock from BEGIN).
_FOLD_LOCK_KEY = 0x666C6D74  # "flmt"
_US = timedelta(microseconds=1)
_UNFINISHED = tuple(s for s in JobState if s not in TERMINAL_JOB_STATES)

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


def _table(model: type[Base]) -> Table:
    table = model.__table__
    assert isinstance(table, Table)
    return table


def _us(start: datetime, end: datetime) -> int:
    """Whole microseconds from start to end, never negative (timestamps are microseconds)."""
    return max(0, (end - start) // _US)


def _seconds(start: datetime, end: datetime) -> float:
    return _us(start, end) / 1e6


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


def _bound_label(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else str(float(bound))


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
            self.uptime_us += _us(self.up_since, at)
        self.up_since = None if to_state == NetState.STOPPED else at
        if to_state == NetState.STARTING:
            self.starting_since = at
        elif to_state == NetState.READY and from_state == NetState.STARTING:
            since, self.starting_since = self.starting_since, None
            if since is not None:
                return _us(since, at)
        return None

    def uptime_s(self, now: datetime) -> float:
        """Seconds out of STOPPED up to `now` (a net up now counts to now)."""
        running = _us(self.up_since, now) if self.up_since is not None else 0
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
                durations.append(_seconds(since, event.at))
    return durations


# --- folding new history into the totals ---------------------------------------------------


class _Deltas:
    """What one fold adds to metric_totals (written at its end, in key order)."""

    def __init__(self) -> None:
        self.values: Counter[tuple[str, str]] = Counter()

    def add(self, metric: str, labels: str = "", value: int = 1) -> None:
        self.values[(metric, labels)] += value

    def observe(self, metric: str, us: int, bounds: Sequence[float], sign: int = 1) -> None:
        self.add(metric, _bound_label(bucket_bound(us / 1e6, bounds)), sign)
        self.add(f"{metric}_sum_us", "", sign * us)


def _take(session: Session, table: Table, *columns: Any, limit: int) -> list[Any]:
    """Mark up to `limit` uncounted rows counted and return them, oldest first. Only rows
    committed before this statement are seen; one committed later waits for the next fold."""
    oldest = (
        select(table.c.id)
        .where(~table.c.counted)
        .order_by(table.c.id)
        .limit(limit)
        .scalar_subquery()
    )
    rows = session.execute(
        update(table)
        .where(table.c.id.in_(oldest))
        .values(counted=True)
        .returning(table.c.id, *columns)
    ).all()
    return sorted(rows, key=lambda r: r[0])


def _fold_job_events(session: Session, deltas: _Deltas, limit: int) -> int:
    events = _table(JobEvent)
    timed_out = (events.c.from_state == JobState.FINISHING) & events.c.reason.startswith(
        REPORT_TIMEOUT_REASON, autoescape=True
    )
    rows = _take(
        session,
        events,
        events.c.job_id,
        events.c.from_state,
        events.c.to_state,
        events.c.at,
        timed_out.label("timed_out"),
        limit=limit,
    )
    timed: list[Any] = []
    for row in rows:
        _id, _job, from_state, to_state, _at, report_timed_out = row
        if to_state in TERMINAL_JOB_STATES:
            deltas.add(JOBS_FINISHED, str(to_state))
        if to_state == JobState.QUEUED and from_state is not None:
            deltas.add(JOB_REQUEUES)
        if report_timed_out:
            deltas.add(REPORT_TIMEOUTS)
        if to_state in (JobState.ASSIGNED, JobState.RUNNING):
            timed.append(row)
    for start in range(0, len(timed), 1000):
        _fold_durations(session, deltas, timed[start : start + 1000])
    return len(rows)


def _fold_durations(session: Session, deltas: _Deltas, rows: Sequence[Any]) -> None:
    """Queue waits (enqueue -> the job's latest assignment: a new assignment replaces the
    job's previous one) and dispatch latencies (a RUNNING pairs with the latest ASSIGNED)."""
    event = _table(JobEvent).alias("event")
    previous = _table(JobEvent).alias("previous")
    latest_assigned_before = (
        select(previous.c.at)
        .where(
            previous.c.job_id == event.c.job_id,
            previous.c.to_state == JobState.ASSIGNED,
            previous.c.id < event.c.id,
        )
        .order_by(previous.c.id.desc())
        .limit(1)
        .correlate(event)
        .scalar_subquery()
    )
    found = {
        event_id: (created, before)
        for event_id, created, before in session.execute(
            select(event.c.id, Job.created_at, latest_assigned_before)
            .join(Job, Job.id == event.c.job_id)
            .where(event.c.id.in_([r[0] for r in rows]))
        )
    }
    for event_id, _job, _from, to_state, at, _timed_out in rows:
        if event_id not in found:
            continue  # the job row is gone
        created, before = found[event_id]
        if to_state == JobState.ASSIGNED:
            if before is not None:
                deltas.observe(QUEUE_WAIT, _us(created, before), QUEUE_WAIT_BUCKETS_S, -1)
            deltas.observe(QUEUE_WAIT, _us(created, at), QUEUE_WAIT_BUCKETS_S)
        elif before is not None:
            deltas.observe(DISPATCH_LATENCY, _us(before, at), DISPATCH_LATENCY_BUCKETS_S)


def _fold_net_events(session: Session, deltas: _Deltas, limit: int) -> int:
    events = _table(NetEvent)
    rows = _take(
        session,
        events,
        events.c.net_name,
        events.c.from_state,
        events.c.to_state,
        events.c.at,
        limit=limit,
    )
    if not rows:
        return 0
    clocks_table = _table(MetricNetClock)
    names = sorted({r[1] for r in rows})
    clocks: dict[str, NetClock] = {name: NetClock() for name in names}
    for name, starting_since, up_since, uptime_us in session.execute(
        select(
            clocks_table.c.net_name,
            clocks_table.c.starting_since,
            clocks_table.c.up_since,
            clocks_table.c.uptime_us,
        ).where(clocks_table.c.net_name.in_(names))
    ):
        clocks[name] = NetClock(starting_since, up_since, uptime_us)
    for _id, name, from_state, to_state, at in sorted(rows, key=lambda r: (r[1], r[4], r[0])):
        cold_us = clocks[name].apply(from_state, to_state, at)
        if cold_us is not None:
            deltas.observe(COLD_START, cold_us, COLD_START_BUCKETS_S)
    _upsert(
        session,
        clocks_table,
        ["net_name"],
        [
            {
                "net_name": name,
                "starting_since": clock.starting_since,
                "up_since": clock.up_since,
                "uptime_us": clock.uptime_us,
            }
            for name, clock in sorted(clocks.items())
        ],
        replace=("starting_since", "up_since", "uptime_us"),
    )
    return len(rows)


def _fold_scale_events(session: Session, deltas: _Deltas, limit: int) -> int:
    events = _table(ScaleEvent)
    rows = _take(session, events, events.c.net_name, events.c.action, events.c.outcome, limit=limit)
    for _id, net, action, outcome in rows:
        deltas.add(SCALE_EVENTS, json.dumps([net, action, outcome]))
    return len(rows)


def _fold_prewarms(session: Session, deltas: _Deltas, limit: int) -> int:
    """Prewarms that ended (or were refused) since the last fold, by outcome: a prewarm is
    counted once, when it has its outcome (ix_prewarms_uncounted finds those)."""
    prewarms = _table(Prewarm)
    ended = (
        select(prewarms.c.id)
        .where(prewarms.c.outcome.is_not(None), ~prewarms.c.counted)
        .order_by(prewarms.c.id)
        .limit(limit)
        .scalar_subquery()
    )
    rows = session.execute(
        update(prewarms)
        .where(prewarms.c.id.in_(ended))
        .values(counted=True)
        .returning(prewarms.c.outcome)
    ).all()
    for (outcome,) in rows:
        deltas.add(PREWARMS, str(outcome))
    return len(rows)


def _uncounted_retries(jobs: Table) -> ColumnElement[int]:
    # The expression of the index ix_jobs_retries_uncounted, spelled the same way.
    return (jobs.c.retries - jobs.c.retries_counted).self_group()


def _fold_retries(session: Session, deltas: _Deltas, limit: int) -> None:
    """Retries counted on jobs since the last fold. A QUEUED job is left alone (a claimer
    must never find it locked by a scrape; its retries count live until it moves on), and
    so is a job another transaction holds (folded next time)."""
    jobs = _table(Job)
    changed = session.execute(
        select(jobs.c.id, jobs.c.retries, jobs.c.retries_counted)
        .where(_uncounted_retries(jobs) > 0, jobs.c.state != JobState.QUEUED)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    if not changed:
        return
    session.execute(
        update(jobs)
        .where(jobs.c.id == bindparam("b_job_id"))
        .values(retries_counted=bindparam("b_retries")),
        [{"b_job_id": job_id, "b_retries": retries} for job_id, retries, _ in changed],
    )
    deltas.add(JOB_RETRIES, "", sum(retries - counted for _, retries, counted in changed))


def _upsert(
    session: Session,
    table: Table,
    keys: Sequence[str],
    rows: Sequence[dict[str, Any]],
    *,
    replace: Sequence[str] = (),
    increment: Sequence[str] = (),
) -> None:
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(table)
    changes = {c: stmt.excluded[c] for c in replace} | {
        c: table.c[c] + stmt.excluded[c] for c in increment
    }
    session.execute(stmt.on_conflict_do_update(index_elements=keys, set_=changes), rows)


def fold(session: Session, limit: int = FOLD_BATCH) -> int:
    """Add the history written since the last fold to the running totals (in the caller's
    transaction, which must commit). Returns how many history rows it folded."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(_FOLD_LOCK_KEY)))
    deltas = _Deltas()
    folded = _fold_job_events(session, deltas, limit)
    folded += _fold_net_events(session, deltas, limit)
    folded += _fold_scale_events(session, deltas, limit)
    folded += _fold_prewarms(session, deltas, limit)
    _fold_retries(session, deltas, limit)
    _upsert(
        session,
        _table(MetricTotal),
        ["metric", "labels"],
        [
            {"metric": metric, "labels": labels, "value": value}
            for (metric, labels), value in sorted(deltas.values.items())
            if value
        ],
        increment=("value",),
    )
    return folded


def catch_up(sessions: sessionmaker[Session], batch: int = FOLD_BATCH) -> int:
    """Fold the whole backlog, one batch per transaction; returns the rows folded. On
    PostgreSQL a long backlog is followed by VACUUM ANALYZE of the history tables: every
    folded row left a dead entry in its table's partial index of uncounted rows, which
    the next scrapes would otherwise walk until autovacuum comes by."""
    total = 0
    while True:
        with unit_of_work(sessions) as session:
            folded = fold(session, batch)
        total += folded
        if not folded:
            break
    engine = sessions.kw["bind"]
    if total >= batch and engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM (ANALYZE) job_events, net_events, scale_events, jobs"
            )
    return total


# --- reading a snapshot ---------------------------------------------------------------------


def _histogram_total(totals: dict[tuple[str, str], int], metric: str) -> Histogram:
    hist = Histogram(sum_us=totals.get((f"{metric}_sum_us", ""), 0))
    for (name, label), value in totals.items():
        if name == metric and value:
            hist.counts[math.inf if label == "+Inf" else float(label)] = value
    return hist


def read_snapshot(
    session: Session,
    now: datetime,
    *,
    callbacks: bool = False,
    idle_grace_s: Mapping[str, float] | None = None,
) -> Snapshot:
    """Fold the new history (see `fold`; the caller commits), then read every metric: the
    current state from the tables, the history from the running totals. `callbacks`:
    CALLBACK_URL is set, so the delivery backlog means something. `idle_grace_s`: each
    scale-to-zero net's idle_timeout_s (settings, not tables)."""
    fold(session)
    snap = Snapshot()
    read_current_extras(session, now, snap, idle_grace_s)
    if callbacks:
        backlog = callbacks_uc.backlog(session)
        snap.callback_undelivered = backlog.undelivered
        snap.callback_failed = backlog.failed
        if backlog.oldest_undelivered_at is not None:
            snap.callback_oldest_undelivered_s = _seconds(backlog.oldest_undelivered_at, now)
    totals: dict[tuple[str, str], int] = {
        (metric, labels): int(value)
        for metric, labels, value in session.execute(
            select(MetricTotal.metric, MetricTotal.labels, MetricTotal.value)
        )
    }
    for state, count in session.execute(
        select(Job.state, func.count()).where(Job.state.in_(_UNFINISHED)).group_by(Job.state)
    ):
        snap.jobs_by_state[JobState(state)] = int(count)
    for state in TERMINAL_JOB_STATES:
        snap.jobs_by_state[state] = totals.get((JOBS_FINISHED, str(state)), 0)
    oldest = session.scalar(select(func.min(Job.created_at)).where(Job.state == JobState.QUEUED))
    snap.oldest_queued_s = _seconds(oldest, now) if oldest is not None else 0.0
    for net_name, count in session.execute(
        select(StrayRun.net_name, func.count()).group_by(StrayRun.net_name)
    ):
        snap.stray_runs[net_name] = int(count)

    snap.queue_wait = _histogram_total(totals, QUEUE_WAIT)
    snap.cold_start = _histogram_total(totals, COLD_START)
    snap.dispatch_latency = _histogram_total(totals, DISPATCH_LATENCY)
    for (metric, labels), value in totals.items():
        if metric == SCALE_EVENTS and value:
            net, action, outcome = json.loads(labels)
            snap.scale_events[(net, action, outcome)] = value
    for name, starting_since, up_since, uptime_us in session.execute(
        select(
            MetricNetClock.net_name,
            MetricNetClock.starting_since,
            MetricNetClock.up_since,
            MetricNetClock.uptime_us,
        )
    ):
        snap.uptime_s[name] = NetClock(starting_since, up_since, uptime_us).uptime_s(now)
    for name in snap.net_states:
        snap.uptime_s.setdefault(name, 0.0)
    jobs = _table(Job)
    unfolded_retries = session.scalar(
        select(func.coalesce(func.sum(_uncounted_retries(jobs)), 0)).where(
            _uncounted_retries(jobs) > 0
        )
    )
    snap.job_retries = totals.get((JOB_RETRIES, ""), 0) + int(unfolded_retries or 0)
    snap.job_requeues = totals.get((JOB_REQUEUES, ""), 0)
    snap.report_timeouts = totals.get((REPORT_TIMEOUTS, ""), 0)
    snap.prewarms = {
        outcome.value: totals.get((PREWARMS, outcome.value), 0) for outcome in PrewarmOutcome
    }
    return snap


def read_current_extras(
    session: Session, now: datetime, snap: Snapshot, idle_grace_s: Mapping[str, float] | None
) -> None:
    """The nets' states and idle times, their grace, the housekeeping rounds and the nets
    prewarms hold: current rows only, read the same way by the collector and by
    tests/metrics_reference.py."""
    # A prewarm's hold defers a net's idle grace (app.usecases.prewarm.idle_start): idle time
    # counts from when the hold ended, so a held net is not idle past its grace.
    deferred = prewarm_uc.idle_starts(session)
    for name, state, idle_since in session.execute(select(Net.name, Net.state, Net.idle_since)):
        snap.net_states[name] = NetState(state)
        idle_from = idle_since if state == NetState.READY else None
        if idle_from is not None and name in deferred:
            idle_from = max(idle_from, deferred[name])
        snap.idle_s[name] = _seconds(idle_from, now) if idle_from is not None else 0.0
    snap.prewarm_held_nets = len(prewarm_uc.live_holds(session, now))
    snap.idle_grace_s = {
        name: grace for name, grace in (idle_grace_s or {}).items() if name in snap.net_states
    }
    for loop, finished_at in session.execute(
        select(HousekeepingRun.loop, HousekeepingRun.finished_at)
    ):
        snap.housekeeping_last_run[loop] = finished_at.timestamp()


# --- exposition ---------------------------------------------------------------------------


def _histogram(
    name: str, documentation: str, hist: Histogram, bounds: Sequence[float]
) -> HistogramMetricFamily:
    # A stored bucket whose bound is not among `bounds` (the bounds changed since) counts in
    # the first bucket above it.
    buckets: list[tuple[str, float]] = [
        (str(float(bound)), sum(c for b, c in hist.counts.items() if b <= bound))
        for bound in bounds
    ]
    buckets.append(("+Inf", hist.count))
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=hist.sum_us / 1e6)


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
        *_idle(snap),
        _housekeeping(snap),
        _histogram(
            "fl_dispatcher_queue_wait_seconds",
            "Seconds from enqueue to the (latest) assignment of each assigned job.",
            snap.queue_wait,
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
            snap.cold_start,
            COLD_START_BUCKETS_S,
        ),
        _histogram(
            "fl_dispatcher_dispatch_latency_seconds",
            "Seconds from a job's ASSIGNED to RUNNING (job_events), per attempt.",
            snap.dispatch_latency,
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
        *_prewarms(snap),
        CounterMetricFamily(
            "fl_dispatcher_report_timeouts",
            "FINISHING jobs settled because flip-api's results report never came.",
            value=snap.report_timeouts,
        ),
        GaugeMetricFamily(
            "fl_dispatcher_callback_undelivered_events",
            "Job events and rejected enqueues not yet delivered to CALLBACK_URL (0 while off).",
            value=snap.callback_undelivered,
        ),
        GaugeMetricFamily(
            "fl_dispatcher_callback_oldest_undelivered_seconds",
            "Age of the oldest job event or rejected enqueue not yet delivered (0 when none).",
            value=snap.callback_oldest_undelivered_s,
        ),
        CounterMetricFamily(
            "fl_dispatcher_callback_failed_events",
            "Events the receiver rejected CALLBACK_MAX_4XX_TRIES times (given up).",
            value=snap.callback_failed,
        ),
    ]


def _idle(snap: Snapshot) -> list[Metric]:
    idle = GaugeMetricFamily(
        "fl_dispatcher_net_idle_seconds",
        "Seconds a READY net has been without a job (0 when it is not idle).",
        labels=["net"],
    )
    for net, seconds in sorted(snap.idle_s.items()):
        idle.add_metric([net], seconds)
    grace = GaugeMetricFamily(
        "fl_dispatcher_net_idle_grace_seconds",
        "A scale-to-zero net's idle grace (idle_timeout_s); always-on nets have none.",
        labels=["net"],
    )
    for net, seconds in sorted(snap.idle_grace_s.items()):
        grace.add_metric([net], seconds)
    return [idle, grace]


def _housekeeping(snap: Snapshot) -> Metric:
    family = GaugeMetricFamily(
        "fl_dispatcher_housekeeping_last_run_timestamp_seconds",
        "Unix time a beat loop last finished a round (reconcile: every 2 x "
        "HOUSEKEEPING_INTERVAL_S); absent until the first.",
        labels=["loop"],
    )
    for loop, at in sorted(snap.housekeeping_last_run.items()):
        family.add_metric([loop], at)
    return family


def _prewarms(snap: Snapshot) -> list[Metric]:
    counter = CounterMetricFamily(
        "fl_dispatcher_prewarms",
        "Prewarms by outcome: used (a job came while held), expired, cancelled, failed, or "
        "refused (rejected, caller_key_conflict, net_misconfigured).",
        labels=["outcome"],
    )
    for outcome in PrewarmOutcome:
        counter.add_metric([outcome.value], snap.prewarms.get(outcome.value, 0))
    held = GaugeMetricFamily(
        "fl_dispatcher_prewarm_held_nets",
        "Nets a live prewarm holds up now (their idle scale-down waits for the hold's end).",
        value=snap.prewarm_held_nets,
    )
    return [counter, held]


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
    """A prometheus_client collector that folds the new history and reads a snapshot from
    SQL on every scrape."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Callable[[], datetime],
        *,
        callbacks: bool = False,
        idle_grace_s: Mapping[str, float] | None = None,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._callbacks = callbacks
        self._idle_grace_s = dict(idle_grace_s or {})

    def collect(self) -> Iterator[Metric]:
        with unit_of_work(self._sessions) as session:  # the fold commits with the read
            snap = read_snapshot(
                session, self._clock(), callbacks=self._callbacks, idle_grace_s=self._idle_grace_s
            )
        yield from families(snap)


def build_registry(
    sessions: sessionmaker[Session],
    clock: Callable[[], datetime],
    *,
    callbacks: bool = False,
    idle_grace_s: Mapping[str, float] | None = None,
) -> CollectorRegistry:
    """A registry holding only the SQL collector (its own, so several apps in one process,
    as in tests, never clash on the global registry)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SqlCollector(sessions, clock, callbacks=callbacks, idle_grace_s=idle_grace_s))
    return registry

"""Folding the history written since the last fold into the running totals (`metric_totals`,
`metric_net_clocks`): each history row is marked counted in the transaction that adds it, so
it is counted exactly once; `catch_up` folds a long backlog in batches."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Table, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from app.db import unit_of_work
from app.metrics.figures import (
    COLD_START,
    COLD_START_BUCKETS_S,
    DISPATCH_LATENCY,
    DISPATCH_LATENCY_BUCKETS_S,
    JOB_REQUEUES,
    JOB_RETRIES,
    JOBS_FINISHED,
    PREWARMS,
    QUEUE_WAIT,
    QUEUE_WAIT_BUCKETS_S,
    REPORT_TIMEOUTS,
    SCALE_EVENTS,
    NetClock,
    bucket_bound,
    micros_between,
    scale_outcome_class,
    table_of,
)
from app.usecases.records import REPORT_TIMEOUT_REASON
from models import (
    TERMINAL_JOB_STATES,
    Job,
    JobEvent,
    JobState,
    MetricNetClock,
    MetricTotal,
    NetEvent,
    Prewarm,
    ScaleEvent,
)

# History rows folded per table and scrape: bounds one scrape after a long pause; a longer
# backlog is folded by the following scrapes (or by `catch_up`).
FOLD_BATCH = 20_000
# Folds are serialised (PostgreSQL: this advisory lock; SQLite: the write lock from BEGIN).
_FOLD_LOCK_KEY = 0x666C6D74  # "flmt"


def _bound_label(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else str(float(bound))


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
    events = table_of(JobEvent)
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
    event = table_of(JobEvent).alias("event")
    previous = table_of(JobEvent).alias("previous")
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
                deltas.observe(
                    QUEUE_WAIT, micros_between(created, before), QUEUE_WAIT_BUCKETS_S, -1
                )
            deltas.observe(QUEUE_WAIT, micros_between(created, at), QUEUE_WAIT_BUCKETS_S)
        elif before is not None:
            deltas.observe(DISPATCH_LATENCY, micros_between(before, at), DISPATCH_LATENCY_BUCKETS_S)


def _fold_net_events(session: Session, deltas: _Deltas, limit: int) -> int:
    events = table_of(NetEvent)
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
    clocks_table = table_of(MetricNetClock)
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
    events = table_of(ScaleEvent)
    rows = _take(session, events, events.c.net_name, events.c.action, events.c.outcome, limit=limit)
    for _id, net, action, outcome in rows:
        deltas.add(SCALE_EVENTS, json.dumps([net, action, scale_outcome_class(outcome)]))
    return len(rows)


def uncounted_retries(jobs: Table) -> ColumnElement[int]:
    """Retries not folded yet: the expression of the index ix_jobs_retries_uncounted, spelled
    the same way."""
    return (jobs.c.retries - jobs.c.retries_counted).self_group()


def _fold_retries(session: Session, deltas: _Deltas, limit: int) -> None:
    """Retries counted on jobs since the last fold. A QUEUED job is left alone (a claimer
    must never find it locked by a scrape; its retries count live until it moves on), and
    so is a job another transaction holds (folded next time)."""
    jobs = table_of(Job)
    changed = session.execute(
        select(jobs.c.id, jobs.c.retries, jobs.c.retries_counted)
        .where(uncounted_retries(jobs) > 0, jobs.c.state != JobState.QUEUED)
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


def _fold_prewarms(session: Session, deltas: _Deltas, limit: int) -> int:
    """Prewarms that ended (or were refused) since the last fold, by outcome: a prewarm is
    counted once, when it has its outcome (ix_prewarms_uncounted finds those)."""
    prewarms = table_of(Prewarm)
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
        table_of(MetricTotal),
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

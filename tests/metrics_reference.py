"""What every metric means, as a full scan of the tables: the collector as it was before it
became incremental (app.metrics). Tests and the scrape benchmark compare the collector with
it; it is far too slow to serve a scrape with a long history, which is why it lives here."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.metrics.figures import (
    COLD_START_BUCKETS_S,
    DISPATCH_LATENCY_BUCKETS_S,
    QUEUE_WAIT_BUCKETS_S,
    Histogram,
    Snapshot,
    cold_starts,
    dispatch_latencies,
    scale_outcome_class,
    uptimes,
)
from app.metrics.read import read_current_extras
from app.usecases.records import REPORT_TIMEOUT_REASON
from models import Job, JobEvent, JobState, NetEvent, Prewarm, PrewarmOutcome, ScaleEvent, StrayRun


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def reference_snapshot(
    session: Session, now: datetime, idle_grace_s: Mapping[str, float] | None = None
) -> Snapshot:
    """Every metric recomputed from every row."""
    snap = Snapshot()
    for state, count in session.execute(select(Job.state, func.count()).group_by(Job.state)):
        snap.jobs_by_state[JobState(state)] = int(count)
    read_current_extras(
        session, now, snap, idle_grace_s
    )  # current rows: read as the collector does
    snap.queue_wait = Histogram.of(
        (
            _seconds(created, assigned)
            for created, assigned in session.execute(
                select(Job.created_at, Job.assigned_at).where(Job.assigned_at.is_not(None))
            )
        ),
        QUEUE_WAIT_BUCKETS_S,
    )
    oldest = session.scalar(select(func.min(Job.created_at)).where(Job.state == JobState.QUEUED))
    snap.oldest_queued_s = _seconds(oldest, now) if oldest is not None else 0.0

    net_events = session.scalars(
        select(NetEvent).order_by(NetEvent.net_name, NetEvent.at, NetEvent.id)
    ).all()
    snap.cold_start = Histogram.of(cold_starts(net_events), COLD_START_BUCKETS_S)
    snap.uptime_s = uptimes(net_events, now)
    for name in snap.net_states:
        snap.uptime_s.setdefault(name, 0.0)

    job_events = session.scalars(
        select(JobEvent)
        .where(JobEvent.to_state.in_((JobState.ASSIGNED, JobState.RUNNING)))
        .order_by(JobEvent.job_id, JobEvent.at, JobEvent.id)
    ).all()
    snap.dispatch_latency = Histogram.of(dispatch_latencies(job_events), DISPATCH_LATENCY_BUCKETS_S)

    for net, action, outcome, count in session.execute(
        select(ScaleEvent.net_name, ScaleEvent.action, ScaleEvent.outcome, func.count()).group_by(
            ScaleEvent.net_name, ScaleEvent.action, ScaleEvent.outcome
        )
    ):
        key = (net, action, scale_outcome_class(outcome))
        snap.scale_events[key] = snap.scale_events.get(key, 0) + int(count)
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
    ended = dict(
        session.execute(
            select(Prewarm.outcome, func.count())
            .where(Prewarm.outcome.is_not(None))
            .group_by(Prewarm.outcome)
        ).all()
    )
    snap.prewarms = {o.value: int(ended.get(o.value, 0)) for o in PrewarmOutcome}
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

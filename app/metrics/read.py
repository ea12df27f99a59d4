"""A scrape's `Snapshot`: the new history folded in first, then the current state read from
the tables and the history from the running totals."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.metrics.figures import (
    COLD_START,
    DISPATCH_LATENCY,
    JOB_REQUEUES,
    JOB_RETRIES,
    JOBS_FINISHED,
    PREWARMS,
    QUEUE_WAIT,
    REPORT_TIMEOUTS,
    SCALE_EVENTS,
    Histogram,
    NetClock,
    Snapshot,
    scale_outcome_class,
    seconds_between,
    table_of,
)
from app.metrics.fold import fold, uncounted_retries
from app.usecases import callbacks as callbacks_uc
from app.usecases.prewarm import holds as prewarm_holds
from models import (
    TERMINAL_JOB_STATES,
    HousekeepingRun,
    Job,
    JobState,
    MetricNetClock,
    MetricTotal,
    Net,
    NetState,
    PrewarmOutcome,
    StrayRun,
)

_UNFINISHED = tuple(s for s in JobState if s not in TERMINAL_JOB_STATES)


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
            snap.callback_oldest_undelivered_s = seconds_between(backlog.oldest_undelivered_at, now)
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
    snap.oldest_queued_s = seconds_between(oldest, now) if oldest is not None else 0.0
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
            # Totals folded before outcomes were classed hold the driver's words: merged
            # into their class, so no free-text series survives.
            key = (net, action, scale_outcome_class(outcome))
            snap.scale_events[key] = snap.scale_events.get(key, 0) + value
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
    jobs = table_of(Job)
    unfolded_retries = session.scalar(
        select(func.coalesce(func.sum(uncounted_retries(jobs)), 0)).where(
            uncounted_retries(jobs) > 0
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
    # A prewarm's hold defers a net's idle grace (app.usecases.prewarm.holds.idle_start): idle time
    # counts from when the hold ended, so a held net is not idle past its grace.
    deferred = prewarm_holds.idle_starts(session)
    for name, state, idle_since in session.execute(select(Net.name, Net.state, Net.idle_since)):
        snap.net_states[name] = NetState(state)
        idle_from = idle_since if state == NetState.READY else None
        if idle_from is not None and name in deferred:
            idle_from = max(idle_from, deferred[name])
        snap.idle_s[name] = seconds_between(idle_from, now) if idle_from is not None else 0.0
    snap.prewarm_held_nets = len(prewarm_holds.live_holds(session, now))
    snap.idle_grace_s = {
        name: grace for name, grace in (idle_grace_s or {}).items() if name in snap.net_states
    }
    for loop, finished_at in session.execute(
        select(HousekeepingRun.loop, HousekeepingRun.finished_at)
    ):
        snap.housekeeping_last_run[loop] = finished_at.timestamp()

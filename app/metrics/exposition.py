"""The Prometheus side: a `Snapshot` as metric families, and the collector (in a registry of
its own) that folds, reads and serves them on every scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from sqlalchemy.orm import Session, sessionmaker

from app.db import unit_of_work
from app.metrics.figures import (
    COLD_START_BUCKETS_S,
    DISPATCH_LATENCY_BUCKETS_S,
    QUEUE_WAIT_BUCKETS_S,
    Histogram,
    Snapshot,
)
from app.metrics.read import read_snapshot
from models import JobState, NetState, PrewarmOutcome


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
        "refused (rejected, caller_key_conflict, net_misconfigured, net_drained).",
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

"""Durations derived from the histories, and the families built from a snapshot."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.metrics.exposition import families
from app.metrics.figures import (
    COLD_START_BUCKETS_S,
    DISPATCH_LATENCY_BUCKETS_S,
    QUEUE_WAIT_BUCKETS_S,
    Histogram,
    Snapshot,
    cold_starts,
    dispatch_latencies,
    uptimes,
)
from models import JobEvent, JobState, NetEvent, NetState

T0 = datetime(2026, 1, 1, tzinfo=UTC)
N = NetState


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def net_events(*moves: tuple[str, NetState | None, NetState, float]) -> list[NetEvent]:
    return [NetEvent(net_name=n, from_state=f, to_state=t, at=at(s)) for n, f, t, s in moves]


def test_cold_start_restarts_its_clock_after_an_unhealthy_attempt():
    events = net_events(
        ("a", N.STOPPED, N.STARTING, 0),
        ("a", N.STARTING, N.UNHEALTHY, 900),
        ("a", N.UNHEALTHY, N.STARTING, 1000),
        ("a", N.STARTING, N.READY, 1045),
        ("a", N.READY, N.BUSY, 1050),
        ("b", N.UNHEALTHY, N.READY, 20),  # not a cold start: it did not come from STARTING
    )
    assert cold_starts(events) == [45.0]


def test_uptime_counts_time_out_of_stopped_and_up_to_now():
    events = net_events(
        ("a", N.STOPPED, N.STARTING, 0),
        ("a", N.STARTING, N.READY, 60),
        ("a", N.READY, N.BUSY, 70),
        ("a", N.BUSY, N.READY, 170),
        ("a", N.READY, N.STOPPING, 770),
        ("a", N.STOPPING, N.STOPPED, 800),
        ("a", N.STOPPED, N.STARTING, 1000),  # up again, until now
        ("b", N.READY, N.BUSY, 500),  # history starts mid-life: before 500 is unknown
    )
    assert uptimes(events, now=at(1100)) == {"a": 900.0, "b": 600.0}


def test_dispatch_latency_pairs_running_with_the_same_attempts_assignment():
    job = uuid.uuid4()
    moves = [
        (None, JobState.QUEUED, 0),
        (JobState.QUEUED, JobState.ASSIGNED, 10),
        (JobState.ASSIGNED, JobState.QUEUED, 500),  # requeued: that attempt never ran
        (JobState.QUEUED, JobState.ASSIGNED, 600),
        (JobState.DISPATCHING, JobState.RUNNING, 642),
    ]
    events = [
        JobEvent(job_id=job, from_state=f, to_state=t, at=at(s))
        for f, t, s in moves
        if t in (JobState.ASSIGNED, JobState.RUNNING)  # what read_snapshot selects
    ]
    assert dispatch_latencies(events) == [42.0]


def test_families_expose_every_series_with_the_snapshot_values():
    snap = Snapshot(
        jobs_by_state={JobState.QUEUED: 2, JobState.RUNNING: 1},
        net_states={"net-a": NetState.BUSY},
        queue_wait=Histogram.of([0.5, 12.0, 4000.0], QUEUE_WAIT_BUCKETS_S),
        cold_start=Histogram.of([75.0], COLD_START_BUCKETS_S),
        dispatch_latency=Histogram.of([3.0, 8.0], DISPATCH_LATENCY_BUCKETS_S),
        scale_events={("net-a", "scale_up", "ok"): 4},
        uptime_s={"net-a": 1234.5},
        job_retries=7,
        job_requeues=3,
    )
    from prometheus_client import CollectorRegistry

    class Fixed:
        def collect(self):
            return families(snap)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("fl_dispatcher_jobs", (("state", "QUEUED"),))] == 2
    assert samples[("fl_dispatcher_jobs", (("state", "FAILED"),))] == 0
    assert samples[("fl_dispatcher_nets", (("net", "net-a"), ("state", "BUSY")))] == 1
    assert samples[("fl_dispatcher_nets", (("net", "net-a"), ("state", "READY")))] == 0
    assert samples[("fl_dispatcher_queue_wait_seconds_bucket", (("le", "1.0"),))] == 1
    assert samples[("fl_dispatcher_queue_wait_seconds_bucket", (("le", "15.0"),))] == 2
    assert samples[("fl_dispatcher_queue_wait_seconds_bucket", (("le", "3600.0"),))] == 2
    assert samples[("fl_dispatcher_queue_wait_seconds_bucket", (("le", "+Inf"),))] == 3
    assert samples[("fl_dispatcher_queue_wait_seconds_sum", ())] == 4012.5
    assert samples[("fl_dispatcher_cold_start_seconds_count", ())] == 1
    assert samples[("fl_dispatcher_dispatch_latency_seconds_sum", ())] == 11
    key = (("action", "scale_up"), ("net", "net-a"), ("outcome", "ok"))
    assert samples[("fl_dispatcher_scale_events_total", key)] == 4
    assert samples[("fl_dispatcher_server_uptime_seconds_total", (("net", "net-a"),))] == 1234.5
    assert samples[("fl_dispatcher_job_retries_total", ())] == 7
    assert samples[("fl_dispatcher_job_requeues_total", ())] == 3

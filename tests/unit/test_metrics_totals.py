"""The running totals behind /metrics say what a full scan of the tables says, scrape after
scrape, however the history is cut between folds (tests/metrics_reference.py is the scan)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from app.db import unit_of_work
from app.metrics.exposition import families
from app.metrics.figures import Snapshot
from app.metrics.fold import fold
from app.metrics.read import read_snapshot
from app.usecases import abort, dispatch, monitor, records, retries, scale_down
from models import Job, JobEvent, JobState, NetEvent, ScaleEvent
from tests.metrics_reference import reference_snapshot
from tests.unit.conftest import World


def _samples(snap: Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    class Fixed:
        def collect(self):
            return families(snap)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


def scrape(world: World) -> Snapshot:
    with unit_of_work(world.rt.sessions) as session:
        return read_snapshot(session, world.clock())


def assert_matches_the_tables(world: World) -> None:
    got = _samples(scrape(world))
    with world.rt.sessions() as session:
        want = _samples(reference_snapshot(session, world.clock()))
    assert set(got) == set(want)
    wrong = {k: (got[k], want[k]) for k in got if not math.isclose(got[k], want[k], abs_tol=1e-6)}
    assert wrong == {}


def uncounted(world: World) -> int:
    with world.rt.sessions() as session:
        return sum(
            session.scalar(select(func.count()).select_from(m).where(~m.counted)) or 0
            for m in (JobEvent, NetEvent, ScaleEvent)
        )


def a_life(world: World, check) -> None:
    """Runs, requeues, retries, aborts and a report timeout on net-a (scale to zero) and
    the always-on `fixed`, calling `check` between every step."""
    first = world.enqueue("first", net="net-a")
    check()
    world.clock.advance(7)
    assignment = dispatch.claim_and_start(world.rt)[0]  # net-a STOPPED -> STARTING
    check()  # a cold start begun in one fold, ended in the next
    net, attempt = assignment.net_name, assignment.attempt
    dispatch.scale_up(world.rt, first, net, attempt)
    retries.count_retry(world.rt, first)  # a retry while ASSIGNED
    world.clock.advance(45)
    dispatch.check_ready(world.rt, first, net, attempt)
    check()
    world.clock.advance(3)
    dispatch.dispatch(world.rt, first, net, attempt)
    check()

    # The server restarts under the job: requeued (attempt 2), then assigned again.
    world.server(net).restart(2000.0)
    world.clock.advance(30)
    monitor.monitor_running_jobs(world.rt)
    abort.settle_stray_runs(world.rt, net)  # the settle the monitor sent: its run is dead
    retries.count_retry(world.rt, first)  # a retry counted on a QUEUED job
    check()
    world.clock.advance(20)
    world.run_pipeline(first)
    check()

    # Finished, held for flip-api's report that never comes (net-a releases on report).
    object.__setattr__(world.rt.settings.net("net-a"), "release_after", "reported")
    world.server(net).statuses["nv-2"] = "FINISHED:COMPLETED"
    world.clock.advance(600)
    monitor.monitor_running_jobs(world.rt)
    check()
    world.clock.advance(world.rt.settings.report_timeout_s + 1)
    monitor.monitor_running_jobs(world.rt)
    retries.count_retry(world.rt, first)  # late: counted on a job already finished
    check()

    # Idle past the grace: scaled down (scale events, uptime ends).
    world.clock.advance(3600)
    scale_down.scale_down_idle_nets(world.rt)
    check()

    # The always-on net runs one job that is aborted, and one that completes.
    second = world.enqueue("second", net="fixed")
    third = world.enqueue("third", net="fixed")
    world.run_pipeline(second)
    world.clock.advance(120)
    world.abort(second)
    check()
    world.clock.advance(5)
    world.run_pipeline(third)
    world.server("fixed").statuses["nv-2"] = "FINISHED:COMPLETED"
    world.clock.advance(60)
    monitor.monitor_running_jobs(world.rt)
    world.abort(world.enqueue("fourth", required_sites=["site-1"]))  # aborted while QUEUED
    check()


def test_every_scrape_matches_a_full_scan_of_the_tables(world: World):
    a_life(world, lambda: assert_matches_the_tables(world))
    assert uncounted(world) == 0
    snap = scrape(world)  # the life above touched every figure
    assert snap.cold_start.count == 2  # net-a twice (the second after the restart)
    assert snap.dispatch_latency.count == 4
    assert snap.queue_wait.count == 3  # one per assigned job: its latest assignment
    assert snap.job_requeues == 1
    assert snap.job_retries == 3
    assert snap.report_timeouts == 1
    assert snap.jobs_by_state[JobState.ABORTED] == 2
    assert snap.uptime_s["net-a"] > 3600
    assert snap.scale_events


def test_a_backlog_folded_a_few_rows_at_a_time_ends_where_a_full_scan_is(world: World):
    def fold_two_rows_per_table() -> None:
        with unit_of_work(world.rt.sessions) as session:
            fold(session, limit=2)

    a_life(world, fold_two_rows_per_table)
    assert uncounted(world) > 0  # a backlog is left...
    assert_matches_the_tables(world)  # ...and the first full fold catches up exactly
    assert uncounted(world) == 0


def test_only_the_new_history_is_read_by_a_scrape(world: World):
    a_life(world, lambda: None)
    scrape(world)
    with world.rt.sessions() as session:
        history = session.scalar(select(func.count()).select_from(JobEvent))
    assert history and history > 20
    world.enqueue("late", net="net-a")
    assert uncounted(world) == 1  # the one QUEUED event is all the next scrape folds
    assert scrape(world).jobs_by_state[JobState.QUEUED] == 1
    assert uncounted(world) == 0


@pytest.mark.parametrize("rows", [0, 1])
def test_retries_count_once_whether_folded_or_not(world: World, rows: int):
    job = world.enqueue("r", net="net-a")
    for _ in range(3):
        retries.count_retry(world.rt, job)
    if rows:
        world.run_pipeline(job)  # no longer QUEUED: its retries are folded
    assert scrape(world).job_retries == 3
    assert scrape(world).job_retries == 3
    with world.rt.sessions() as session:
        counted = session.scalar(select(Job.retries_counted).where(Job.id == job))
    assert counted == (3 if rows else 0)  # a QUEUED job is never locked by a scrape
    with world.rt.sessions.begin() as session:
        records.get_job(session, job)
    assert_matches_the_tables(world)

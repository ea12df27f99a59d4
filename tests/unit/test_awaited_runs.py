"""monitor_awaited_runs (beat, every AWAITED_POLL_S): the runs a QUEUED job waits for are
settled soon after they end, and only those are polled."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from app import names
from app.celery_app import beat_schedule
from app.settings import Settings
from app.sim.deployment import settings_for
from app.sim.savings import LOCAL, replay
from app.sim.trace import parse_trace
from app.sim.workload import NetSpec, WorldSpec
from app.usecases import monitor
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of


@pytest.fixture
def two_nets(tmp_path, job_root, sqlite_factory, clock) -> World:
    nets = [net_decl(tmp_path, "net-a", "ecs"), net_decl(tmp_path, "net-b", "ecs")]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock)


def polled(world: World, *net_names: str) -> list[str]:
    """Record which nets' runs are asked for their status."""
    calls: list[str] = []
    for name in net_names:
        admin = world.admin(name)
        read = admin.job_status

        def job_status(nvflare_job_id: str, name: str = name, read=read):  # type: ignore[no-untyped-def]
            calls.append(name)
            return read(nvflare_job_id)

        admin.job_status = job_status  # type: ignore[method-assign]
    return calls


def test_a_run_a_queued_job_waits_for_is_settled_and_the_queue_moves(two_nets):
    world = two_nets
    running = world.enqueue("running", net="net-a")
    world.run_pipeline(running)
    waiting = world.enqueue("waiting", net="net-a")
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    world.outbox.sent.clear()

    assert monitor.monitor_awaited_runs(world.rt) == {str(running): "completed"}
    assert world.job(running).state == JobState.COMPLETED
    assert world.job(waiting).state == JobState.QUEUED  # placed by the assign it kicked:
    assert names.ASSIGN_NEXT_JOB in [task for task, _ in world.outbox.sent]


def test_runs_no_queued_job_waits_for_are_not_polled(two_nets):
    world = two_nets
    a = world.enqueue("on-a", net="net-a")
    world.run_pipeline(a)
    b = world.enqueue("on-b", net="net-b")
    world.run_pipeline(b)
    calls = polled(world, "net-a", "net-b")

    assert monitor.monitor_awaited_runs(world.rt) == {}
    world.enqueue("for-b", net="net-b")  # pinned: waits for net-b only
    assert monitor.monitor_awaited_runs(world.rt) == {str(b): "running"}
    assert calls == ["net-b"]
    world.enqueue(
        "anywhere", required_sites=["site-1"]
    )  # unpinned: waits for whichever net frees first
    monitor.monitor_awaited_runs(world.rt)
    assert sorted(calls) == ["net-a", "net-b", "net-b"]
    # The full round still watches everything.
    assert set(monitor.monitor_running_jobs(world.rt)) == {str(a), str(b)}


def test_a_job_held_by_its_own_stray_run_does_not_count_as_waiting(two_nets):
    world = two_nets
    a = world.enqueue("on-a", net="net-a")
    world.run_pipeline(a)
    held = world.enqueue("held", net="net-a")
    world.add_stray(held, "net-b", None, "token")
    calls = polled(world, "net-a")
    assert monitor.monitor_awaited_runs(world.rt) == {}
    assert calls == []


def test_a_net_whose_server_is_not_answering_is_left_to_the_full_round(two_nets):
    world = two_nets
    a = world.enqueue("on-a", net="net-a")
    world.run_pipeline(a)
    world.enqueue("waiting", net="net-a")
    world.server("net-a").up = False
    monitor.monitor_running_jobs(world.rt)  # the full round notes it unreachable
    assert world.net("net-a").unreachable_since is not None
    calls = polled(world, "net-a")
    world.clock.advance(1)
    assert monitor.monitor_awaited_runs(world.rt) == {}
    assert calls == []


def test_beat_polls_awaited_runs_every_awaited_poll_s_unless_off(tmp_path, job_root):
    def settings(poll: str) -> Settings:
        return Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path / "data",
            JOB_ROOT=job_root,
            NETS=json.dumps([net_decl(tmp_path, "net-a", "ecs")]),
            AWAITED_POLL_S=poll,
        )

    entry = beat_schedule(settings("2.5"))["monitor-awaited-runs"]
    assert entry["task"] == names.MONITOR_AWAITED_RUNS
    assert entry["schedule"] == timedelta(seconds=2.5)
    assert entry["options"] == {"expires": 2.5, "queue": names.HOUSEKEEPING_QUEUE}
    assert beat_schedule(settings("1"))["monitor-awaited-runs"]["schedule"] == timedelta(seconds=1)
    assert "monitor-awaited-runs" not in beat_schedule(settings("0"))


@pytest.mark.parametrize("awaited_poll_s", [0.0, 1.0, 3.0])
def test_beat_polls_awaited_runs_every_awaited_poll_s_and_not_at_all_at_zero(awaited_poll_s):
    world = WorldSpec(
        nets=(NetSpec("net-a", "ecs", 60.0, 120.0, ("site-1",)),),
        housekeeping_interval_s=7.0,
        keep_alive_interval_s=90.0,
        awaited_poll_s=awaited_poll_s,
    )
    schedule = beat_schedule(settings_for(world, per_job_fl_server=True))
    expected = {
        names.ASSIGN_NEXT_JOB: 7.0,
        names.SCALE_DOWN_IDLE_NETS: 7.0,
        names.MONITOR_RUNNING_JOBS: 7.0,
        names.RECONCILE: 14.0,
        names.KEEP_ALIVE_BUSY_NETS: 90.0,
    }
    if awaited_poll_s:
        expected[names.MONITOR_AWAITED_RUNS] = awaited_poll_s
    assert {e["task"]: e["schedule"].total_seconds() for e in schedule.values()} == expected


def test_a_job_queued_behind_a_run_starts_within_a_queued_poll_of_its_end():
    # One always-on net; the first job ends at about 607 s, between two housekeeping ticks
    # (600 and 615 s): without the awaited-run poll the second starts at the 615 s tick.
    trace = parse_trace("submitted_at,duration_s\n0,607\n10,60\n")
    run = replay(trace, ["net-a"], None, LOCAL)
    first_end = run.waits[0] + 607
    assert run.waits[1] + 10 - first_end < 1.5


def test_an_unpinned_job_that_is_over_makes_no_net_awaited(two_nets):
    world = two_nets
    done = world.enqueue("done", required_sites=["site-1"])  # could have run on any net
    world.run_to_completion(done)
    running = world.enqueue("running", net="net-a")
    world.run_pipeline(running)
    calls = polled(world, "net-a", "net-b")
    assert monitor.monitor_awaited_runs(world.rt) == {}
    assert calls == []

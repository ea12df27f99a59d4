"""Idle scale-down: a READY scale-to-zero net idle for its whole grace (to the second) is
stopped, unless a job holds it or a QUEUED job could run there; another net's job is no
reason to keep it (nor a queued job that cannot be claimed while its earlier run is
unsettled), and a net still in its grace is left alone."""

from __future__ import annotations

import json

import pytest

from app.settings import Settings
from app.usecases import dispatch, records, scale_down
from models import JobState, NetState, ReasonCode
from tests.fixtures.db import net_decl
from tests.unit.conftest import World
from tests.unit.scale_history import scale_decisions

IDLE_S = 60


@pytest.fixture
def two_nets(tmp_path, job_root, sqlite_factory, clock):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps(
            [net_decl(tmp_path, n, "ecs", idle_timeout_s=IDLE_S) for n in ("net-a", "net-b")]
        ),
        PER_JOB_FL_SERVER="true",
    )
    return World(settings, sqlite_factory, clock)


def _idle(world, name: str) -> None:
    """The net ran a job that is over: READY, its idle grace starting now."""
    job_id = world.enqueue(f"done-{name}", net=name)
    world.run_to_completion(job_id)
    assert world.net(name).state == NetState.READY


def test_a_net_idle_for_exactly_its_grace_is_stopped_saying_why(two_nets):
    world = two_nets
    _idle(world, "net-a")
    world.clock.advance(IDLE_S - 1)
    assert scale_down.scale_down_idle_nets(world.rt) == []
    world.clock.advance(1)
    assert scale_down.scale_down_idle_nets(world.rt) == ["net-a"]
    assert world.net("net-a").state == NetState.STOPPED
    assert scale_decisions(world, "net-a")[-1] == (0, "idle grace passed")


def test_only_the_nets_past_their_grace_are_stopped(two_nets):
    world = two_nets
    _idle(world, "net-b")
    world.clock.advance(IDLE_S / 2)
    _idle(world, "net-a")
    world.clock.advance(IDLE_S / 2)
    assert scale_down.scale_down_idle_nets(world.rt) == ["net-b"]
    assert world.net("net-a").state == NetState.READY


def test_another_nets_job_does_not_keep_an_idle_net_up(two_nets):
    world = two_nets
    _idle(world, "net-a")
    world.run_pipeline(world.enqueue("busy", net="net-b"))
    world.clock.advance(IDLE_S)
    assert scale_down.scale_down_idle_nets(world.rt) == ["net-a"]
    assert world.net("net-b").state == NetState.BUSY


def test_a_net_claimed_by_a_job_is_not_stopped_though_long_ready(two_nets):
    world = two_nets
    _idle(world, "net-a")
    world.clock.advance(IDLE_S)
    job_id = world.enqueue("next", net="net-a")
    dispatch.claim_and_start(world.rt)  # a warm net: claimed, still READY
    assert world.job(job_id).state == JobState.ASSIGNED
    assert scale_down.scale_down_idle_nets(world.rt) == []
    assert world.driver("net-a").replicas == 1


def test_a_queued_job_that_could_run_there_keeps_an_idle_net_up(two_nets):
    world = two_nets
    _idle(world, "net-a")
    world.clock.advance(IDLE_S)
    world.enqueue("unpinned", required_sites=["site-1"])  # not claimed yet: any net will do
    assert scale_down.scale_down_idle_nets(world.rt) == []
    assert world.driver("net-a").replicas == 1


def test_the_locked_recheck_decides_on_the_net_as_it_is_now(two_nets):
    """Between the candidate read and the row lock another worker may have used the net: the
    re-check under the lock, not the earlier read, decides (a net that is no longer READY, or
    whose grace restarted, keeps its server)."""
    world = two_nets
    _idle(world, "net-a")
    world.clock.advance(IDLE_S + 1)
    busy = world.enqueue("meanwhile", net="net-a")
    world.run_pipeline(busy)  # claimed and running after the candidate read
    assert not scale_down._scale_down_if_idle(world.rt, "net-a", world.clock())
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session, busy, JobState.COMPLETED, "done", world.clock(), code=ReasonCode.RUN_COMPLETED
        )
    # READY again, its grace restarted now: idle by the earlier read, not by the row
    assert not scale_down._scale_down_if_idle(world.rt, "net-a", world.clock())
    assert world.driver("net-a").replicas == 1 and world.net("net-a").state == NetState.READY
    world.clock.advance(IDLE_S)
    assert scale_down._scale_down_if_idle(world.rt, "net-a", world.clock())
    assert world.driver("net-a").replicas == 0
    world.clock.advance(IDLE_S + 1)  # a net that is not READY (here STOPPED) is never taken
    calls = list(world.driver("net-a").calls)
    assert not scale_down._scale_down_if_idle(world.rt, "net-a", world.clock())
    assert world.driver("net-a").calls == calls and world.net("net-a").state == NetState.STOPPED


def test_a_warm_net_claimed_after_its_grace_keeps_its_server_without_an_error(two_nets):
    """Claimed, a READY net has no idle time (the claim ended it): it is no candidate
    failure, just not idle."""
    world = two_nets
    _idle(world, "net-a")
    world.clock.advance(IDLE_S + 1)
    world.enqueue("claimed", net="net-a")
    dispatch.claim_and_start(world.rt)  # READY with an ASSIGNED job: its chain comes next
    assert scale_down.scale_down_idle_nets(world.rt) == []
    net = world.net("net-a")
    assert (net.state, net.last_error) == (NetState.READY, None)
    assert world.driver("net-a").replicas == 1


def test_a_net_that_stopped_is_no_longer_idle_and_a_finished_job_says_when(two_nets):
    world = two_nets
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    assert world.job(job_id).finished_at is None  # running
    world.clock.advance(5)
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session,
            job_id,
            JobState.COMPLETED,
            "done",
            world.clock(),
            code=ReasonCode.RUN_COMPLETED,
        )
    assert world.job(job_id).finished_at == world.clock()
    assert world.net("net-a").idle_since == world.clock()
    world.clock.advance(IDLE_S)
    assert scale_down.scale_down_idle_nets(world.rt) == ["net-a"]
    net = world.net("net-a")
    assert (net.state, net.idle_since) == (NetState.STOPPED, None)


def test_an_idle_net_is_stopped_though_a_queued_job_waits_on_a_stray_elsewhere(world):
    done = world.enqueue("done", net="net-a")
    world.run_to_completion(done)
    blocked = world.enqueue("blocked", required_sites=["site-1"])  # fits net-a, stray elsewhere
    world.add_stray(blocked, "fixed", "nv-old")
    world.clock.advance(60)
    assert scale_down.scale_down_idle_nets(world.rt) == ["net-a"]
    assert world.job(blocked).state == JobState.QUEUED

"""reconcile's watch of always-on nets (PER_JOB_FL_SERVER off, or a static server): a
scalable net left down by scale-to-zero mode gets exactly one replica asked for, once; a
static server is never scaled; a reachable server brings a net that was left behind (or in
OUTAGE) back to READY, while a STARTING net with a job is left to its chain."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.usecases import dispatch, reconciler, services
from app.usecases.net_repairs import net_rows, watch_always_on
from models import JobState, NetEvent, NetState, ReasonCode
from tests.unit.scale_history import scale_decisions


def _set_state(world, name: str, state: NetState) -> None:
    with world.rt.sessions.begin() as session:
        services.get_net(session, name).state = state


def test_a_scalable_net_left_down_gets_one_replica_once(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    assert scale_decisions(world, "net-a") == [(1, "always-on net: one replica")]
    assert world.driver("net-a").replicas == 1
    assert world.net("net-a").state == NetState.READY
    reconciler.reconcile(world.rt)
    assert len(scale_decisions(world, "net-a")) == 1  # asked for already: not again


def test_a_net_left_down_whose_replica_is_already_asked_for_is_not_asked_again(always_on):
    world = always_on
    world.driver("net-a").replicas = 1  # desired 1, the net row still says STOPPED
    reconciler.reconcile(world.rt)
    assert scale_decisions(world, "net-a") == []
    assert world.net("net-a").state == NetState.READY


def test_a_static_server_is_never_scaled(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    assert scale_decisions(world, "fixed") == []
    assert world.net("fixed").state == NetState.READY


@pytest.mark.parametrize("state", [NetState.READY, NetState.BUSY, NetState.STARTING])
def test_a_net_that_is_up_is_not_scaled(always_on, state):
    world = always_on
    world.driver("net-a").replicas = 0
    _set_state(world, "net-a", state)
    reconciler.reconcile(world.rt)
    assert scale_decisions(world, "net-a") == []


def test_a_reachable_server_ends_an_outage(always_on):
    world = always_on
    world.server("fixed").up = False
    reconciler.reconcile(world.rt)
    assert world.net("fixed").state == NetState.OUTAGE
    world.server("fixed").up = True
    repaired = reconciler.reconcile(world.rt).repaired
    assert world.net("fixed").state == NetState.READY
    assert "fixed: OUTAGE -> READY" in repaired


def test_a_starting_net_with_a_job_is_left_to_its_chain(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    _set_state(world, "fixed", NetState.STARTING)
    job_id = world.enqueue("j", net="fixed")
    with world.rt.sessions.begin() as session:
        services.get_job(session, job_id).assign("fixed", world.clock())
    repaired = reconciler.reconcile(world.rt).repaired
    assert world.net("fixed").state == NetState.STARTING
    assert not [r for r in repaired if r.startswith("fixed")]
    assert world.job(job_id).state == JobState.ASSIGNED


def test_a_misconfigured_always_on_net_is_no_repair(always_on):
    world = always_on
    _set_state(world, "fixed", NetState.MISCONFIGURED)
    repaired = reconciler.reconcile(world.rt).repaired
    assert not [r for r in repaired if r.startswith("fixed")]
    assert world.net("fixed").state == NetState.MISCONFIGURED
    assert dispatch.assign_jobs(world.rt) == []


def _last_move(world, name: str):
    with world.rt.sessions() as session:
        e = session.scalars(
            select(NetEvent).where(NetEvent.net_name == name).order_by(NetEvent.id)
        ).all()[-1]
        return e.from_state, e.to_state, e.reason


def test_an_outage_under_a_running_job_ends_busy_and_says_why(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    world.server("fixed").up = False
    reconciler.reconcile(world.rt)
    assert _last_move(world, "fixed") == (
        NetState.BUSY,
        NetState.OUTAGE,
        "always-on server unreachable",
    )
    world.server("fixed").up = True
    reconciler.reconcile(world.rt)
    assert _last_move(world, "fixed") == (
        NetState.OUTAGE,
        NetState.BUSY,
        "always-on server reachable",
    )
    assert world.job(job_id).state == JobState.RUNNING


def test_a_healthy_always_on_net_is_no_repair(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    assert not [r for r in reconciler.reconcile(world.rt).repaired if r.startswith("fixed")]


def test_an_outage_ends_ready_when_its_job_ended_after_the_rounds_read(always_on):
    """The round reads every net once; a job that ended since (lost, aborted) must not
    leave its net BUSY with no job when the outage ends: the target is decided under the
    net's lock."""
    world = always_on
    reconciler.reconcile(world.rt)
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    _set_state(world, "fixed", NetState.OUTAGE)
    row = net_rows(world.rt)["fixed"]
    assert row.job_id == job_id
    with world.rt.sessions.begin() as session:
        services.finish_job(
            session, job_id, JobState.FAILED, "lost", world.clock(), code=ReasonCode.SERVER_LOST
        )
    assert watch_always_on(world.rt, "fixed", row) == "OUTAGE -> READY"
    assert world.net("fixed").state == NetState.READY


def test_an_outage_that_ends_ready_counts_the_nets_idle_time_from_then(always_on):
    """The idle time the status API and the idle metric show (idle_since) starts when the
    server came back, not before the outage."""
    world = always_on
    reconciler.reconcile(world.rt)
    world.server("fixed").up = False
    reconciler.reconcile(world.rt)
    world.clock.advance(600)
    world.server("fixed").up = True
    reconciler.reconcile(world.rt)
    net = world.net("fixed")
    assert (net.state, net.idle_since) == (NetState.READY, world.clock())


def test_an_outage_another_round_ended_since_this_rounds_read_is_no_repair(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    world.server("fixed").up = False
    reconciler.reconcile(world.rt)
    row = net_rows(world.rt)["fixed"]  # this round reads OUTAGE ...
    world.server("fixed").up = True
    reconciler.reconcile(world.rt)  # ... and another round ends it first
    assert watch_always_on(world.rt, "fixed", row) == ""
    assert world.net("fixed").state == NetState.READY

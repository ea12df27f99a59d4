"""reconcile's repairs of scale-to-zero nets: a lost scale-up is re-driven only once it is
overdue and the driver was never asked; a net left STARTING without a job becomes READY
once its server is ready; and nothing is stopped under a job claimed while reconcile looked
at the driver. A driver that says the net is misconfigured takes it out of service once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from app.errors import DriverMisconfigured
from app.usecases import dispatch, fleet, net_repairs, reconciler, records
from models import Job, JobState, NetEvent, NetState


def _pipelines(world):
    return [kw for task, kw in world.outbox.sent if task == "pipeline"]


def _lease_held(world, job_id) -> None:
    """The job's step lease is held for an hour (its chain is alive as far as the lease can
    tell): only the net repair under test can re-drive it."""
    with world.rt.sessions.begin() as session:
        records.get_job(session, job_id).step_due_at = world.clock() + timedelta(hours=1)


def test_a_lost_scale_up_is_redriven_once_overdue_and_never_asked(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)  # the chain is lost before scale_up
    _lease_held(world, job_id)
    world.outbox.sent.clear()
    world.clock.advance(world.rt.settings.stuck_after_s)  # not overdue yet
    reconciler.reconcile(world.rt)
    assert _pipelines(world) == []
    world.clock.advance(1)
    reconciler.reconcile(world.rt)
    assert _pipelines(world) == [{"job_id": str(job_id), "net_name": "net-a", "attempt": 0}]


def test_a_scale_up_the_driver_was_asked_for_is_not_redriven(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    _lease_held(world, job_id)
    world.driver("net-a").replicas = 1  # asked for: the chain is slow, not lost
    world.outbox.sent.clear()
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    reconciler.reconcile(world.rt)
    assert _pipelines(world) == []


def _starting_without_a_job(world):
    job_id = world.enqueue("first", net="net-a")
    dispatch.claim_and_start(world.rt)
    with world.rt.sessions.begin() as session:
        records.abort_job(session, job_id, "flip-api: stop", world.clock())
    assert world.net("net-a").state == NetState.STARTING


def _claimed_while_the_driver_is_read(world, driver) -> str:
    """Enqueue a job on net-a that is claimed just as reconcile reads the driver (after the
    round read the net's row): the race its re-checks under lock are for. Its id."""
    real_observe = driver.observe
    late = world.enqueue("late", net="net-a")

    def claimed_meanwhile():
        dispatch.claim_and_start(world.rt)
        return real_observe()

    driver.observe = claimed_meanwhile  # type: ignore[method-assign]
    return late


def test_a_starting_net_whose_job_went_away_is_ready_and_idle_once_up(world):
    _starting_without_a_job(world)
    world.driver("net-a").replicas = 1
    reconciler.reconcile(world.rt)
    net = world.net("net-a")
    assert (net.state, net.idle_since) == (NetState.READY, world.clock())


def test_a_job_claimed_while_reconcile_looks_at_the_driver_keeps_its_server(world):
    _starting_without_a_job(world)
    world.clock.advance(world.rt.settings.net("net-a").ready_timeout_s + 1)  # start abandoned
    driver = world.driver("net-a")
    late = _claimed_while_the_driver_is_read(world, driver)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STARTING
    assert world.job(late).state == JobState.ASSIGNED
    assert driver.calls == []  # never scaled down under the new job


def test_a_drifted_server_is_left_to_a_job_claimed_meanwhile(world):
    driver = world.driver("net-a")
    driver.replicas = 1  # up while STOPPED: drift
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    late = _claimed_while_the_driver_is_read(world, driver)
    repaired = reconciler.reconcile(world.rt).repaired
    assert driver.replicas == 1
    assert world.job(late).state == JobState.ASSIGNED
    assert [r for r in repaired if r.startswith("net-a")] == []  # nothing was repaired


def test_a_ready_net_claimed_while_its_server_looked_gone_is_left_to_its_job(world):
    """The round read a READY net without a job and its driver shows no server: drift, but a
    job claimed onto the warm net meanwhile owns it now, so the net stays READY for the
    job's chain (which scales it up again) and the round reports no repair."""
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").state = NetState.READY  # the driver has 0 replicas
    driver = world.driver("net-a")
    late = _claimed_while_the_driver_is_read(world, driver)
    repaired = reconciler.reconcile(world.rt).repaired
    assert world.net("net-a").state == NetState.READY
    assert world.job(late).state == JobState.ASSIGNED
    assert [r for r in repaired if r.startswith("net-a")] == []


def test_a_driver_that_says_misconfigured_takes_the_net_out_of_service_once(world):
    world.driver("net-a").fail_with = DriverMisconfigured("service fl-server-net-a missing")
    reconciler.reconcile(world.rt)
    net = world.net("net-a")
    assert (net.state, net.last_error) == (
        NetState.MISCONFIGURED,
        "service fl-server-net-a missing",
    )
    reconciler.reconcile(world.rt)
    with world.rt.sessions() as session:
        marked = session.scalar(
            select(func.count())
            .select_from(NetEvent)
            .where(NetEvent.net_name == "net-a", NetEvent.to_state == NetState.MISCONFIGURED)
        )
    assert marked == 1


def test_a_starting_net_claimed_while_reconcile_looks_is_left_to_its_job(world):
    _starting_without_a_job(world)
    driver = world.driver("net-a")
    driver.replicas = 1
    late = _claimed_while_the_driver_is_read(world, driver)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STARTING  # the job's chain moves it
    assert world.job(late).state == JobState.ASSIGNED
    assert dispatch.check_ready(world.rt, late, "net-a", 0).step.value == "done"
    assert world.net("net-a").state == NetState.READY  # its server is up


def test_a_scale_up_not_yet_overdue_is_no_repair(world):
    world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)  # its chain is on the way: nothing to repair yet
    assert not [r for r in reconciler.reconcile(world.rt).repaired if r.startswith("net-a")]


def test_reconcile_never_stops_a_net_under_a_job_claimed_meanwhile(world):
    # tests/sim/FINDINGS.md, hole 7: drift (a server up while STOPPED) and a job claimed before
    # reconcile decides.
    world.driver("net-a").replicas = 1
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)  # the net is STARTING with a job now
    reconciler.reconcile(world.rt)
    assert world.driver("net-a").replicas == 1
    assert world.job(job_id).state == JobState.ASSIGNED


@pytest.mark.parametrize("read_as", [NetState.STOPPING, NetState.UNHEALTHY])
def test_a_scale_down_decided_on_an_old_read_spares_a_net_claimed_meanwhile(world, read_as):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    assert world.net("net-a").state == NetState.STARTING
    stale = fleet.NetRow(read_as, world.clock())
    net_repairs.repair_scaling_net(world.rt, "net-a", stale)
    assert world.driver("net-a").replicas == 1
    assert world.net("net-a").state == NetState.STARTING


def test_a_drift_stop_never_takes_a_server_a_job_is_on_however_it_got_there(world):
    """The drift stop re-checks under the net's lock that no job is on the net, not only its
    state: a job put on the STOPPED net after the round's read other than by a claim (a hand
    edit of the rows, a path a later change adds) keeps its server."""
    driver = world.driver("net-a")
    driver.replicas = 1  # up while STOPPED: drift
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    edited = world.enqueue("edited", net="net-a")
    real_observe = driver.observe

    def placed_meanwhile():
        with world.rt.sessions.begin() as session:
            session.execute(
                update(Job)
                .where(Job.caller_key == "edited")
                .values(state=JobState.ASSIGNED, net_name="net-a", assigned_at=world.clock())
            )
        return real_observe()

    driver.observe = placed_meanwhile  # type: ignore[method-assign]
    reconciler.reconcile(world.rt)
    assert world.job(edited).state == JobState.ASSIGNED
    assert driver.replicas == 1
    assert world.net("net-a").state == NetState.STOPPED

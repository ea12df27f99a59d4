"""A net whose settings are wrong is taken out of service until a human fixes them: at a
worker's start (`prepare_nets_at_start` uses these), and reset when the worker restarts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from app.errors import AdminMisconfigured
from app.usecases import claims, declared_nets, dispatch, records, scaling
from models import JobState, NetEvent, NetState
from tests.unit.scale_history import scale_decisions


def _net_with_history(session, name):
    net = records.get_net(session, name)
    events = session.scalars(select(NetEvent).where(NetEvent.net_name == name)).all()
    return net, [(e.from_state, e.to_state, e.reason) for e in events]


def test_a_misconfigured_net_says_why_and_takes_no_job(world):
    with world.rt.sessions.begin() as session:
        assert declared_nets.mark_misconfigured(
            session, "net-a", "kit names another server", world.clock()
        )
    with world.rt.sessions() as session:
        net, history = _net_with_history(session, "net-a")
    assert (net.state, net.last_error) == (NetState.MISCONFIGURED, "kit names another server")
    assert history[-1] == (NetState.STOPPED, NetState.MISCONFIGURED, "kit names another server")
    world.enqueue("j", net="net-a")
    with world.rt.sessions.begin() as session:
        assert claims.claim_next_job(session, world.rt.settings, world.clock()) is None


def test_a_net_with_an_active_job_is_not_taken_out_of_service(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        assert not declared_nets.mark_misconfigured(
            session, "net-a", "kit check failed", world.clock()
        )
    # Its run goes on; the verdict waits on the row for the job's end, and says so.
    net = world.net("net-a")
    assert (net.state, net.misconfigured_after_job) == (NetState.BUSY, "kit check failed")
    assert net.last_error == f"misconfigured once job {job_id} ends: kit check failed"


def test_a_worker_restart_puts_a_misconfigured_net_back_in_service(world):
    with world.rt.sessions.begin() as session:
        declared_nets.mark_misconfigured(
            session, "net-a", "kit names another server", world.clock()
        )
    with world.rt.sessions.begin() as session:  # a mere sync (not a start) keeps it out
        assert declared_nets.sync_nets(session, world.rt.settings, world.clock()) == []
    assert world.net("net-a").state == NetState.MISCONFIGURED
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
    net = world.net("net-a")
    assert (net.state, net.last_error) == (NetState.STOPPED, None)


@pytest.mark.parametrize(
    ("lease_left_s", "state"),
    [(1, NetState.STOPPING), (0, NetState.STOPPING), (-1, NetState.STOPPED)],
    ids=["lease running", "lease ends now", "lease passed"],
)
def test_a_restart_keeps_a_misconfigured_net_stopping_until_its_stop_lease_has_passed(
    world, lease_left_s, state
):
    """A scale-down call of the net may still land until its lease has passed (up to its
    due time included, as reconcile reads it): a restart puts the net back STOPPING till
    then, never STOPPED, which a job could claim under the landing call."""
    with world.rt.sessions.begin() as session:
        declared_nets.mark_misconfigured(
            session, "net-a", "kit names another server", world.clock()
        )
        due = world.clock() + timedelta(seconds=30)
        records.get_net(session, "net-a").stop_due_at = due
    world.clock.advance(30 - lease_left_s)
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
    assert world.net("net-a").state == state
    assert scaling.stop_in_flight(due, world.clock()) == (state == NetState.STOPPING)


def test_a_net_found_misconfigured_in_the_pipeline_says_why_and_so_does_its_job(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)

    def wrong_ca(sites):
        raise AdminMisconfigured("kit signed by another CA")

    world.admin("net-a").is_ready = wrong_ca  # type: ignore[method-assign]
    with pytest.raises(AdminMisconfigured):
        dispatch.check_ready(world.rt, job_id, "net-a", 0)
    net = world.net("net-a")
    assert (net.state, net.last_error) == (NetState.MISCONFIGURED, "kit signed by another CA")
    with world.rt.sessions() as session:
        _, history = _net_with_history(session, "net-a")
    assert history[-1][1:] == (NetState.MISCONFIGURED, "kit signed by another CA")
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 0)
    assert job.last_error == "net net-a misconfigured: kit signed by another CA"
    assert world.driver("net-a").replicas == 0
    assert scale_decisions(world, "net-a")[-1] == (0, "net misconfigured")


def test_another_nets_job_does_not_keep_a_net_in_service(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        assert declared_nets.mark_misconfigured(
            session, "fixed", "kit names another server", world.clock()
        )
    assert world.net("fixed").state == NetState.MISCONFIGURED
    assert world.net("net-a").state == NetState.BUSY


def test_a_restart_never_resets_a_misconfigured_net_to_stopped_under_a_job(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:  # however it came to be marked
        records.get_net(session, "net-a").transition(NetState.MISCONFIGURED, world.clock(), "x")
        declared_nets.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.job(job_id).state == JobState.RUNNING

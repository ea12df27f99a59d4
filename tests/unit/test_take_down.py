"""take_down: a scale-to-zero net's server is taken away now, whatever it runs, unless a job
was claimed onto it meanwhile (that job owns the server). The net reads STOPPED once the
driver confirms, whatever state it was in."""

from __future__ import annotations

from sqlalchemy import select

from app.usecases import dispatch, records, scaling
from models import JobState, NetEvent, NetState


def _moves(world, name):
    with world.rt.sessions() as session:
        events = session.scalars(select(NetEvent).where(NetEvent.net_name == name)).all()
        return [(e.from_state, e.to_state, e.reason) for e in events]


def test_a_net_with_a_job_claimed_meanwhile_is_not_taken_down(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    assert not scaling.take_down(world.rt, "net-a", "stray run")
    assert world.driver("net-a").replicas == 1
    assert world.net("net-a").state == NetState.STARTING
    assert world.job(job_id).state == JobState.ASSIGNED


def test_a_net_left_busy_without_a_job_is_taken_down_through_unhealthy(world):
    world.driver("net-a").replicas = 1
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").state = NetState.BUSY
    assert scaling.take_down(world.rt, "net-a", "run lost")
    assert world.driver("net-a").replicas == 0
    assert _moves(world, "net-a")[-2:] == [
        (NetState.BUSY, NetState.UNHEALTHY, "run lost"),
        (NetState.UNHEALTHY, NetState.STOPPED, "run lost"),
    ]


def test_a_ready_net_is_taken_down_through_stopping(world):
    world.driver("net-a").replicas = 1
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").state = NetState.READY
    assert scaling.take_down(world.rt, "net-a", "stray run")
    assert _moves(world, "net-a")[-2:] == [
        (NetState.READY, NetState.STOPPING, "stray run"),
        (NetState.STOPPING, NetState.STOPPED, "stray run"),
    ]

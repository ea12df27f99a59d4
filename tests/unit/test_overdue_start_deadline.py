"""An always-on start's readiness deadline counts from when its replica was asked for, not
from its STARTING: a net left STARTING at zero replicas (a driver throttling the scale call,
a beat that did not run) is no OUTAGE the round its replica is finally asked for."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.errors import DriverTransientError
from app.usecases import reconciler, records
from models import NetEvent, NetState
from tests.unit.scale_history import scale_decisions


def _start(world, name: str) -> None:
    """The net moves to STARTING now, with no job and no replica asked for."""
    with world.rt.sessions.begin() as session:
        records.get_net(session, name).transition(NetState.STARTING, world.clock(), "prewarm")


def _last_reason(world, name: str) -> str:
    with world.rt.sessions() as session:
        return session.scalars(
            select(NetEvent.reason).where(NetEvent.net_name == name).order_by(NetEvent.id)
        ).all()[-1]


def _throttled(world, name: str) -> None:
    """The driver refuses the net's scale calls (throttled); observing works."""

    def throttled(replicas: int) -> None:
        raise DriverTransientError("ThrottlingException: rate exceeded")

    world.driver(name).scale = throttled  # type: ignore[method-assign]


@pytest.mark.parametrize("comes_up", [False, True], ids=["never-up", "up-in-time"])
def test_a_start_left_at_zero_gets_its_deadline_from_the_ask(always_on, comes_up, caplog):
    """Reviewer's edge (round 15): net-a STARTING at zero replicas for longer than its
    ready_timeout_s with no replica asked for (no reconcile round ran: beat was down). The
    round that asks for it does so a moment ago: no OUTAGE (no page) then, nor until
    ready_timeout_s after that ask; a server that comes up meanwhile is READY, one that does
    not is an OUTAGE past that deadline, its reason counting from the ask."""
    world = always_on
    world.server("net-a").up = False
    _start(world, "net-a")
    deadline = world.rt.settings.net("net-a").ready_timeout_s
    world.clock.advance(deadline + 60)
    with caplog.at_level("ERROR"):
        reconciler.reconcile(world.rt)
    assert scale_decisions(world, "net-a")[-1] == (1, "always-on net: one replica")
    assert world.driver("net-a").replicas == 1
    assert world.net("net-a").state == NetState.STARTING  # was OUTAGE: a false page
    assert not [r for r in caplog.records if r.levelname == "ERROR" and "OUTAGE" in r.msg]
    world.clock.advance(deadline)  # exactly the deadline since the ask: still booting
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STARTING
    world.clock.advance(1)
    world.server("net-a").up = comes_up
    reconciler.reconcile(world.rt)
    if comes_up:
        assert world.net("net-a").state == NetState.READY
        return
    assert world.net("net-a").state == NetState.OUTAGE
    reason = _last_reason(world, "net-a")
    assert f"not started {deadline + 1:.0f}s after its replica was asked for" in reason


def test_a_platform_refusing_every_ask_pages_past_the_deadline_from_the_first(always_on, caplog):
    """Every scale call throttled (or the platform's API down): each round asks again and
    fails. The start is an OUTAGE (a page) ready_timeout_s after the first ask, not never
    (the failing call ended the round before its deadline was looked at) nor from each new
    ask; the round still says it could not check the net."""
    world = always_on
    world.server("net-a").up = False
    _start(world, "net-a")
    _throttled(world, "net-a")
    deadline = world.rt.settings.net("net-a").ready_timeout_s
    [note] = [r for r in reconciler.reconcile(world.rt).repaired if r.startswith("net-a")]
    assert "not checked" in note  # the first ask, refused
    world.clock.advance(deadline)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STARTING
    world.clock.advance(1)
    with caplog.at_level("ERROR"):
        [note] = [r for r in reconciler.reconcile(world.rt).repaired if r.startswith("net-a")]
    assert "not checked" in note
    assert world.net("net-a").state == NetState.OUTAGE
    assert f"not started {deadline + 1:.0f}s after its replica was asked for" in _last_reason(
        world, "net-a"
    )
    assert [r for r in caplog.records if r.levelname == "ERROR" and "OUTAGE" in r.msg]


def test_a_replica_asked_before_the_start_does_not_extend_its_deadline(always_on):
    """Only an ask made for this start counts: one from an earlier start (the replica then
    taken back by hand) leaves the deadline counted from STARTING."""
    world = always_on
    reconciler.reconcile(world.rt)  # net-a's replica asked for (STOPPED -> READY)
    assert len(scale_decisions(world, "net-a")) == 1
    world.clock.advance(60)
    world.server("net-a").up = False
    with world.rt.sessions.begin() as session:  # the row drifted down; the replica is not
        records.get_net(session, "net-a").transition(NetState.STOPPED, world.clock(), "drift")
    _start(world, "net-a")  # the replica is still desired: nothing asked this start
    deadline = world.rt.settings.net("net-a").ready_timeout_s
    world.clock.advance(deadline + 1)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.OUTAGE
    assert f"not started {deadline + 1:.0f}s after STARTING" in _last_reason(world, "net-a")


def test_a_scale_call_whose_reply_was_lost_counts_as_the_ask(always_on):
    """The call applied but its reply was lost (an error recorded): the next round sees the
    replica desired and asks no more, so that call is the ask the deadline counts from."""
    world = always_on
    world.server("net-a").up = False
    _start(world, "net-a")
    deadline = world.rt.settings.net("net-a").ready_timeout_s
    world.clock.advance(deadline + 60)  # no round ran meanwhile (the beat was down)
    driver = world.driver("net-a")
    real = driver.scale

    def applied_then_lost(replicas: int) -> None:
        real(replicas)
        raise DriverTransientError("UpdateService timed out (it was applied)")

    driver.scale = applied_then_lost  # type: ignore[method-assign]
    [note] = [r for r in reconciler.reconcile(world.rt).repaired if r.startswith("net-a")]
    assert "not checked" in note
    driver.scale = real  # type: ignore[method-assign]
    assert driver.replicas == 1
    world.clock.advance(30)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STARTING
    world.clock.advance(deadline - 30 + 1)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.OUTAGE
    assert "after its replica was asked for" in _last_reason(world, "net-a")


def test_a_replica_the_platform_keeps_losing_does_not_put_the_page_off(always_on):
    """Asked for again every round (a container that exits at start reads as desired 0):
    the deadline counts from the first ask of the start, not from each new one."""
    world = always_on
    world.server("net-a").up = False
    _start(world, "net-a")
    deadline = world.rt.settings.net("net-a").ready_timeout_s
    rounds = int(deadline // 30) + 1
    for _ in range(rounds):
        reconciler.reconcile(world.rt)
        assert world.net("net-a").state == NetState.STARTING
        world.driver("net-a").replicas = 0  # lost again before the next round
        world.clock.advance(30)
    reconciler.reconcile(world.rt)
    assert len(scale_decisions(world, "net-a")) == rounds + 1
    assert world.net("net-a").state == NetState.OUTAGE


def test_a_start_left_at_zero_waits_for_its_sites_from_the_ask(always_on):
    """Reviewer's edge (round 16): the same start left at zero past ready_timeout_s, its
    replica asked for late. Its server answers before any site connected: it waits for its
    sites (STARTING) until ready_timeout_s after the ask, as a start asked for in time does,
    not READY at once because its STARTING is old; READY once the sites connect, or at that
    deadline all the same."""
    world = always_on
    world.server("net-a").up = False
    _start(world, "net-a")
    deadline = world.rt.settings.net("net-a").ready_timeout_s
    world.clock.advance(deadline + 60)
    reconciler.reconcile(world.rt)  # the ask
    assert world.driver("net-a").replicas == 1
    world.server("net-a").up = True
    world.server("net-a").sites = []
    world.clock.advance(30)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STARTING  # was READY with no site connected
    world.clock.advance(deadline - 30)  # exactly the deadline since the ask
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STARTING
    world.clock.advance(1)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.READY  # up, its sites not: READY all the same

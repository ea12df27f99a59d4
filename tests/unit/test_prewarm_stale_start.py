"""A warm-up that read its net STARTING and then stalled (a slow driver or admin call) acts,
when it resumes, on the start it read, never on a new start of the net begun meanwhile
(sweep seed 5853 fixed `_give_up`; the same stale read reaches `mark_ready` and
`_release`, and reconcile's round read abandoning a start: the sweep's stale-start band)."""

from __future__ import annotations

from app.usecases import prewarm, reconciler, records
from app.usecases.prewarm import warm_up as prewarm_warm_up
from app.usecases.prewarm.warm_up import Warm
from models import NetState
from tests.unit.prewarm_world import READY_TIMEOUT_S, ask, pw, view  # noqa: F401 (fixture)


def _restart(world, key: str) -> None:
    """The start read ends (up, idle, taken down) and a new prewarm's start begins."""
    for state in (NetState.READY, NetState.STOPPING, NetState.STOPPED):
        with world.rt.sessions.begin() as session:
            records.get_net(session, "net-a").transition(state, world.clock(), "meanwhile")
    world.driver("net-a").replicas = 0
    world.server("net-a").up = False
    world.clock.advance(1)
    assert ask(world, key, net="net-a", within_s=600).notified  # STOPPED -> STARTING again


def test_a_stalled_readiness_check_does_not_mark_a_new_start_ready(pw):  # noqa: F811
    """The warm-up saw the first start's server answer, then stalled in is_ready; meanwhile
    that start went READY, idle, down, and a second prewarm started the net again (no
    replica yet). Resumed, it marked the new start READY from the old server's answer
    (and noted p2's hold ready, with the old server's start time): a READY net with no
    server. It leaves the new start STARTING."""
    ask(pw, "p1", net="net-a", within_s=600)
    pw.server("net-a").up = False
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY  # asked
    pw.server("net-a").up = True
    admin = pw.rt.admin("net-a")
    is_ready = admin.is_ready

    def stalled_is_ready(sites):
        answer = is_ready(sites)  # the first start's server answers ...
        admin.is_ready = is_ready  # (one stall)
        prewarm.cancel_prewarm(pw.rt, "p1")
        _restart(pw, "p2")  # ... and is gone before the answer is acted on
        return answer

    admin.is_ready = stalled_is_ready  # type: ignore[method-assign]
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    assert pw.net("net-a").state == NetState.STARTING  # was READY: no server behind it
    assert view(pw, "p2").status != "held"


def test_a_stalled_release_does_not_stop_a_new_prewarms_start(pw):  # noqa: F811
    """p1 was cancelled before the warm-up read the net (no live hold: release it), and the
    warm-up stalled at the driver; meanwhile the start went down and p2's hint started the
    net again, its replica not asked yet. Resumed (desired 0, no live hold as read), the
    warm-up released p2's start: STOPPING, scaled to 0, while p2's live hold wants it up."""
    _release_stalled_by(pw, lambda: _restart(pw, "p2"))
    assert pw.net("net-a").state == NetState.STARTING  # was STOPPING: p2's start released


def test_a_stalled_release_does_not_stop_a_start_a_new_hold_wants(pw):  # noqa: F811
    """The same stale read without a new start: the warm-up read no live hold (p1
    cancelled) and stalled at the driver; meanwhile p2 was granted on the STARTING net
    (same start, its warm-up re-sent). Resumed, the warm-up released the start p2 holds."""
    result = _release_stalled_by(pw, lambda: ask(pw, "p2", net="net-a", within_s=600))
    assert pw.net("net-a").state == NetState.STARTING  # was STOPPING: p2's start released
    # (sweep seed 7116) and warmed on: p2's grant sent no warm-up of its own, so a skip left
    # the start STARTING with no ask until reconcile abandoned it at its deadline.
    assert result.step == Warm.NOT_READY
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY  # the next poll
    assert pw.driver("net-a").replicas == 1  # asked


def _release_stalled_by(world, meanwhile):
    """p1 asked and cancelled; its warm-up stalls once at the driver while `meanwhile` runs."""
    ask(world, "p1", net="net-a", within_s=600)
    prewarm.cancel_prewarm(world.rt, "p1")
    _stall_once(world.driver("net-a"), meanwhile)
    return prewarm_warm_up.warm_up(world.rt, "net-a")


def _asked_p1(world):
    """p1's start, its replica asked for, its server not up yet: net-a's driver."""
    ask(world, "p1", net="net-a", within_s=600)
    world.server("net-a").up = False
    assert prewarm_warm_up.warm_up(world.rt, "net-a").step == Warm.NOT_READY  # asked
    return world.driver("net-a")


def _stall_once(driver, meanwhile) -> None:
    """The driver's next observe stalls while `meanwhile` runs (which may raise), then answers."""
    observe = driver.observe

    def stalled_observe():
        driver.observe = observe  # (one stall)
        meanwhile()
        return observe()

    driver.observe = stalled_observe


def test_a_stalled_reconcile_does_not_abandon_a_new_start(pw):  # noqa: F811
    """(tests.sim.stale_starts' ABANDON) A reconcile round read net-a STARTING (p1's start,
    its replica asked for) and stalled at the driver past the net's ready_timeout_s;
    meanwhile that start went READY, idle, down, and p2's hint started the net again and
    asked for its replica. Resumed, the round counted the deadline from the start it had
    read (from p1's ask, long past) and abandoned p2's start 0 s after its ask ("start
    abandoned": STOPPING, scaled to 0). A start read before the stall is not the start it
    abandons: the new one is left to its own deadline."""
    driver = _asked_p1(pw)

    def meanwhile():
        pw.clock.advance(READY_TIMEOUT_S + 10)
        prewarm.cancel_prewarm(pw.rt, "p1")
        _restart(pw, "p2")
        assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY  # p2's ask

    _stall_once(driver, meanwhile)
    reconciler.reconcile(pw.rt)
    assert pw.net("net-a").state == NetState.STARTING  # was STOPPED: "start abandoned"
    assert driver.replicas == 1


def test_a_stalled_warm_up_does_not_ask_a_replica_for_a_released_start(pw):  # noqa: F811
    """(break-it of acd7a59) The warm-up read p1's hold live and stalled at the driver;
    meanwhile p1 was cancelled and another warm-up released the start (STOPPED, scaled to 0).
    Resumed (desired 0, its hold live as read), it asked the driver for a replica of the
    STOPPED net: a server up with nothing wanting it until the drift repair, STUCK_AFTER_S
    later. The ask is made only for the start read, while a live hold wants it."""
    ask(pw, "p1", net="net-a", within_s=600)
    driver = pw.driver("net-a")
    observe = driver.observe

    def stalled_observe():
        driver.observe = observe  # (one stall)
        prewarm.cancel_prewarm(pw.rt, "p1")
        prewarm_warm_up.warm_up(pw.rt, "net-a")  # released
        assert pw.net("net-a").state == NetState.STOPPED and driver.replicas == 0
        return observe()

    driver.observe = stalled_observe  # type: ignore[method-assign]
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    assert pw.net("net-a").state == NetState.STOPPED
    assert driver.replicas == 0  # was 1: asked for the released start


def test_a_stalled_reconcile_leaves_a_net_moved_on_since_to_the_next_round(pw):  # noqa: F811
    """(sweep seed 912, a late-start DENY world) A reconcile round read net-a STARTING (p1's
    start) and stalled at the driver; meanwhile the start went READY, and the platform began
    denying the driver (an IAM change propagating). Resumed, the denial raised out of the
    stale round's branch for a STARTING net and took the READY net out of service
    (MISCONFIGURED) on what it had read; for an always-on OUTAGE whose server answers, a
    denial is READY again (round 16's D3). The round leaves a net that moved on since its
    read to the next round, which judges it as it is."""
    from app.errors import MisconfigurationError

    driver = _asked_p1(pw)

    def ready_then_denied():
        pw.clock.advance(20)
        pw.server("net-a").up = True
        assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.READY
        raise MisconfigurationError("AccessDeniedException (an IAM change propagating)")

    _stall_once(driver, ready_then_denied)
    reconciler.reconcile(pw.rt)
    assert pw.net("net-a").state == NetState.READY  # was MISCONFIGURED
    # The platform denies for good: the next round, reading the net as it is, marks it.
    driver.fail_with = MisconfigurationError("AccessDeniedException")
    pw.clock.advance(30)
    reconciler.reconcile(pw.rt)
    assert pw.net("net-a").state == NetState.MISCONFIGURED

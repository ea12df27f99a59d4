"""A scale-to-zero start with no job (a prewarm's) counts its readiness deadline from the first
ask for its replica, as an always-on start's does (`outages.start_age_s`): a warm-up that
ran late (workers down or backlogged past ready_timeout_s, its message re-sent) asks for
the replica then, and neither reconcile ("start abandoned") nor the warm-up itself (holds
failed) gives the start up before the server had ready_timeout_s to boot."""

from __future__ import annotations

import pytest

from app.usecases import reconciler
from app.usecases.prewarm import warm_up as prewarm_warm_up
from app.usecases.prewarm.warm_up import Warm
from models import NetState
from tests.unit.prewarm_world import READY_TIMEOUT_S, ask, pw, view  # noqa: F401 (fixture)
from tests.unit.scale_history import scale_decisions


@pytest.mark.parametrize("comes_up", [False, True], ids=["never-up", "up-in-time"])
def test_a_late_ask_is_not_abandoned_by_reconcile_before_its_deadline(pw, comes_up):  # noqa: F811
    """The warm-up asks for the replica 30 s before the start's deadline counted from
    STARTING. The next reconcile round, past that deadline, leaves the booting start alone
    (it was "start abandoned": STOPPING, scaled to 0, 31 s into the boot); the start is
    abandoned ready_timeout_s after the ask if its server never answers, READY if it does."""
    ask(pw, "p1", net="net-a", within_s=600)
    pw.server("net-a").up = False
    pw.clock.advance(READY_TIMEOUT_S - 30)  # the warm-up did not run until now
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    assert scale_decisions(pw, "net-a")[-1][0] == 1
    pw.clock.advance(31)
    reconciler.reconcile(pw.rt)
    assert pw.net("net-a").state == NetState.STARTING  # was STOPPED: "start abandoned"
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY  # was GAVE_UP
    pw.clock.advance(READY_TIMEOUT_S - 31)  # exactly the deadline since the ask
    reconciler.reconcile(pw.rt)
    assert pw.net("net-a").state == NetState.STARTING
    pw.clock.advance(1)
    pw.server("net-a").up = comes_up
    reconciler.reconcile(pw.rt)
    if comes_up:
        assert pw.net("net-a").state == NetState.READY
        return
    assert pw.net("net-a").state in (NetState.STOPPING, NetState.STOPPED)
    assert pw.driver("net-a").replicas == 0


def test_a_warm_up_run_past_the_deadline_asks_and_waits_for_the_boot(pw):  # noqa: F811
    """The warm-up's first run comes after ready_timeout_s (its message waited): it asks for
    the replica and polls on (it gave up in the same call, the holds failed, the server not
    yet asked to boot); it gives up ready_timeout_s after that ask."""
    ask(pw, "p1", net="net-a", within_s=600)
    pw.server("net-a").up = False
    pw.clock.advance(READY_TIMEOUT_S + 60)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY  # was GAVE_UP
    assert view(pw, "p1").status != "failed"
    pw.clock.advance(READY_TIMEOUT_S)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    pw.clock.advance(1)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.GAVE_UP
    assert view(pw, "p1").status == "failed"


def test_a_start_never_asked_for_is_abandoned_from_its_starting(world):
    """A start nobody asks a replica for (its job went away before its scale-up, no hold):
    nothing to wait for, abandoned past ready_timeout_s from STARTING, as before."""
    from app.usecases import records

    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").transition(NetState.STARTING, world.clock(), "claim")
    _abandoned_only_after(world, world.rt.settings.net("net-a").ready_timeout_s)


def _abandoned_only_after(world, seconds: float) -> None:
    """Reconcile leaves net-a's start alone `seconds` from now, and abandons it 1 s later."""
    world.clock.advance(seconds)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STARTING
    world.clock.advance(1)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state in (NetState.STOPPING, NetState.STOPPED)


def _asked_by_another_worker(world) -> None:
    """Another worker's ask for the replica, between its driver call and the scale event it
    writes after the call: the driver desires the replica, no ask is recorded yet."""
    world.driver("net-a").scale(1)


def test_a_warm_up_does_not_give_up_a_boot_another_worker_is_asking_for(pw):  # noqa: F811
    """Two warm-ups of one net held past ready_timeout_s (a broker outage) run at once: one
    asked the driver and has not written its scale event yet; the other read the driver
    (desired 1) and no ask since STARTING, counted from STARTING and gave the start up 0 s
    into its boot (UNHEALTHY, scaled down, holds failed). It asks again (idempotent) and
    counts from its own ask; it gives up ready_timeout_s after that ask."""
    ask(pw, "p1", net="net-a", within_s=600)
    pw.server("net-a").up = False
    pw.clock.advance(READY_TIMEOUT_S + 60)
    _asked_by_another_worker(pw)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY  # was GAVE_UP
    assert view(pw, "p1").status != "failed"
    assert pw.driver("net-a").replicas == 1
    assert scale_decisions(pw, "net-a")[-1][0] == 1  # its own ask, recorded
    pw.clock.advance(READY_TIMEOUT_S)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    pw.clock.advance(1)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.GAVE_UP
    assert view(pw, "p1").status == "failed"


def test_reconcile_does_not_abandon_a_boot_a_warm_up_is_asking_for(pw):  # noqa: F811
    """A warm-up held past ready_timeout_s asks the driver; a reconcile round between its
    driver call and its scale event read no ask since STARTING and abandoned the start it
    had just asked for. It asks again instead and abandons it ready_timeout_s after."""
    ask(pw, "p1", net="net-a", within_s=600)
    pw.server("net-a").up = False
    pw.clock.advance(READY_TIMEOUT_S + 60)
    _asked_by_another_worker(pw)
    reconciler.reconcile(pw.rt)
    assert pw.net("net-a").state == NetState.STARTING  # was STOPPING: "start abandoned"
    assert pw.driver("net-a").replicas == 1
    _abandoned_only_after(pw, READY_TIMEOUT_S)
    assert pw.driver("net-a").replicas == 0


def _desired_before_the_start(world) -> None:
    """net-a's driver desires a replica from before the start, one that never comes up (a
    replica scaled up by hand, crash-looping), and a prewarm starts the net."""
    world.driver("net-a").replicas = 1
    world.server("net-a").up = False
    ask(world, "p1", net="net-a", within_s=500)
    assert prewarm_warm_up.warm_up(world.rt, "net-a").step == Warm.NOT_READY  # asks nothing


def test_a_start_desired_before_it_is_given_up_within_twice_ready_timeout_s(pw):  # noqa: F811
    """No ask of its own is ever recorded: past the deadline from STARTING it cannot be told
    from an ask in flight (above), so it is asked once and given ready_timeout_s from that
    ask: given up, its holds failed, at most 2 x ready_timeout_s (and two polls) after
    STARTING, never asked again."""
    _desired_before_the_start(pw)
    pw.clock.advance(READY_TIMEOUT_S + 1)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY  # asked once
    pw.clock.advance(READY_TIMEOUT_S + 1)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.GAVE_UP
    assert view(pw, "p1").status == "failed"
    assert pw.net("net-a").state in (NetState.UNHEALTHY, NetState.STOPPING, NetState.STOPPED)


def test_a_start_past_its_deadline_no_live_hold_wants_is_not_asked_again(pw):  # noqa: F811
    """The holds ended (cancelled): nobody wants the start. Past its deadline it is given up
    (warm_up) or abandoned (reconcile), not asked again for another ready_timeout_s though
    the driver desires the replica with no ask recorded."""
    from app.usecases import prewarm

    _desired_before_the_start(pw)
    prewarm.cancel_prewarm(pw.rt, "p1")
    pw.clock.advance(READY_TIMEOUT_S + 1)
    calls = len(pw.driver("net-a").calls)
    reconciler.reconcile(pw.rt)
    assert pw.net("net-a").state in (NetState.STOPPING, NetState.STOPPED)  # abandoned
    assert 1 not in pw.driver("net-a").calls[calls:]
    assert pw.driver("net-a").replicas == 0


def test_a_warm_up_past_the_deadline_no_live_hold_wants_gives_up(pw):  # noqa: F811
    """warm_up's side of the same: the holds ended, no ask asked again; the start given up."""
    from app.usecases import prewarm

    _desired_before_the_start(pw)
    prewarm.cancel_prewarm(pw.rt, "p1")
    pw.clock.advance(READY_TIMEOUT_S + 1)
    calls = len(pw.driver("net-a").calls)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.GAVE_UP
    assert 1 not in pw.driver("net-a").calls[calls:]


def test_a_warm_up_stalled_across_a_new_start_does_not_give_that_start_up(pw):  # noqa: F811
    """(seed 5853) A warm-up read net-a STARTING, then stalled at the driver past the net's
    ready_timeout_s; meanwhile the start came up, went down, and a job's claim started the
    net again and asked for its replica (the job then aborted). Resumed, the warm-up counted
    the deadline from the start it had read (from that start's ask, long past) and gave up
    the new one 1 s into its boot: UNHEALTHY, scaled down. A start read before the stall is
    not the start it gives up: it leaves the new one alone."""
    from app.usecases import records
    from app.usecases.scaling import scale_net

    ask(pw, "p1", net="net-a", within_s=600)
    pw.server("net-a").up = False
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY  # asked
    driver = pw.driver("net-a")
    observe = driver.observe

    def stalled_observe():
        # While this worker stalls: the start ends and a new one is asked for.
        pw.clock.advance(READY_TIMEOUT_S + 10)
        for state in (NetState.STOPPING, NetState.STOPPED, NetState.STARTING):
            with pw.rt.sessions.begin() as session:
                records.get_net(session, "net-a").transition(state, pw.clock(), "meanwhile")
        scale_net(pw.rt, "net-a", 0, "stopped")
        pw.clock.advance(1)
        scale_net(pw.rt, "net-a", 1, "job assigned")
        return observe()

    driver.observe = stalled_observe  # type: ignore[method-assign]
    result = prewarm_warm_up.warm_up(pw.rt, "net-a")
    assert result.step != Warm.GAVE_UP, result
    assert pw.net("net-a").state == NetState.STARTING  # was UNHEALTHY
    assert driver.replicas == 1

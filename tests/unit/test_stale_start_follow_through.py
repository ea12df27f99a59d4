"""What follows a stale check's restraint: a start warmed on for a hold granted meanwhile is
released once that hold ends, two warm-ups of one start ask one replica, and a
misconfiguration a stalled round left to the next round is judged there
(`test_prewarm_stale_start.py`)."""

from __future__ import annotations

from app.usecases import prewarm
from app.usecases.prewarm import warm_up as prewarm_warm_up
from app.usecases.prewarm.warm_up import Warm
from models import NetState
from tests.unit.prewarm_world import ask, pw  # noqa: F401 (fixture)
from tests.unit.test_prewarm_stale_start import _release_stalled_by


def test_a_start_warmed_on_for_a_late_hold_is_released_once_that_hold_ends(pw):  # noqa: F811
    """Warmed on for p2 (granted during the stall); p2 cancelled before the next poll: that
    poll releases the start, no replica asked, no poll after."""
    assert _release_stalled_by(pw, lambda: ask(pw, "p2", net="net-a", within_s=600)).step == (
        Warm.NOT_READY
    )
    prewarm.cancel_prewarm(pw.rt, "p2")
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.SKIPPED
    assert pw.net("net-a").state in (NetState.STOPPING, NetState.STOPPED)
    assert pw.driver("net-a").replicas == 0


def test_two_warm_ups_of_one_start_ask_one_replica_and_both_end(pw):  # noqa: F811
    """p2's repeat re-sends a warm-up while the first, stalled, warms on: both poll, one
    replica, both end once READY."""
    _release_stalled_by(pw, lambda: ask(pw, "p2", net="net-a", within_s=600))
    ask(pw, "p2", net="net-a", within_s=600)  # a repeat: a second warm-up
    pw.server("net-a").up = False
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    assert pw.driver("net-a").replicas == 1
    pw.server("net-a").up = True
    steps = [prewarm_warm_up.warm_up(pw.rt, "net-a").step for _ in range(2)]
    assert steps[0] == Warm.READY and steps[1] == Warm.SKIPPED
    assert pw.driver("net-a").replicas == 1

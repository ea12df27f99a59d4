"""A reconcile round that read a resting Flower net STOPPED and then stalled (a slow driver
call) acts, when it resumes, on the stop it read, never on a stop of the net made meanwhile:
the settling start's rest counts from the stop it read (`net_repairs._start_to_settle`), so
a round that stalled across a whole settling start (started, never answered, given up,
STOPPED again) started the net again at once, its rest skipped (break-it review of
acd7a59: the same stale read as its "start abandoned")."""

from __future__ import annotations

import pytest

from app.usecases import net_repairs, reconciler
from models import NetState
from tests.unit.test_flower_stray_rest import _resting
from tests.unit.test_revived_strays import _net_state as _state
from tests.unit.test_revived_strays import _strays

pytestmark = pytest.mark.unit


def test_a_stalled_round_does_not_skip_the_rest_after_a_settling_start(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """fl-a rests at zero (its SuperLink never answers its overdue stray). A round reads it
    STOPPED as its rest ends and stalls at the driver; meanwhile another round starts it to
    settle the stray, the start is given up at its readiness deadline and the net is STOPPED
    again (a settling start that failed: the next one is a rest away). Resumed, the stalled
    round measured the rest from the stop it had read, long over, and started the net again
    0 s after the new stop: a SuperLink that never answers started twice in a row."""
    world = _resting(tmp_path, job_root, sqlite_factory, clock)
    stopped_at = world.net("fl-a").state_changed_at
    rest_s = net_repairs._settle_rest_s(world.rt, "fl-a", stopped_at)
    assert rest_s > 0, "(resting)"
    clock.advance((stopped_at - clock()).total_seconds() + rest_s + 1)  # the rest is over
    driver = world.driver("fl-a")
    observe = driver.observe
    ready_s = world.rt.settings.net("fl-a").ready_timeout_s

    def stalled_observe():
        driver.observe = observe  # (one stall)
        reconciler.reconcile(world.rt)  # another round: the settling start
        assert _state(world, "fl-a") == NetState.STARTING and driver.replicas == 1
        clock.advance(ready_s + 1)
        for _ in range(5):  # given up at its deadline, scaled to 0
            reconciler.reconcile(world.rt)
            clock.advance(30)
            if _state(world, "fl-a") == NetState.STOPPED and driver.replicas == 0:
                break
        assert _state(world, "fl-a") == NetState.STOPPED and driver.replicas == 0
        return observe()

    driver.observe = stalled_observe  # type: ignore[method-assign]
    reconciler.reconcile(world.rt)
    assert len(_strays(world, "fl-a")) == 1
    assert _state(world, "fl-a") == NetState.STOPPED, "started again with no rest"
    assert driver.replicas == 0

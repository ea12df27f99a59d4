"""A Flower net's rest between settling starts when the clock is stepped back behind both its
stray's recording and the human's fix that last took it out of MISCONFIGURED: sweep seed
misconfig 241 and forced drift 1617 (tests/sim/FINDINGS.md, "Round 13"; found by three
helpers of round 13 apart): 29 starts in two hours on 66819a8, whether the fix mended the kit
or the service; the fix is now placed by the order of the net's events, not by its time."""

from __future__ import annotations

import pytest

from app.usecases import declared_nets
from models import NetState
from tests.unit.test_flower_stray_rest_clock_and_idle_runs import _broken
from tests.unit.test_flower_stray_settling import _hours, _rounds, _starts
from tests.unit.test_revived_strays import _net_state as _state
from tests.unit.test_revived_strays import _world


@pytest.mark.parametrize("mended", ["service", "kit"])
def test_a_clock_stepped_back_behind_the_fix_and_the_stray_brings_back_no_storm(
    tmp_path, job_root, sqlite_factory, clock, mended
) -> None:
    """fl-a holds a stray; its settling start finds the service missing (MISCONFIGURED);
    ten minutes later a human fixes it and restarts the workers, but the SuperLink never
    answers again (a host gone): the net is started, given up, and rests between tries.
    Then the clock steps back three hours (a VM resumed from a snapshot, an NTP step),
    behind both the stray's recording and the fix. Round 12's D1 fix promised the step
    brings back no storm of starts (the longest rest once a start was tried)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    server = world.server("fl-a")
    server.statuses["7"] = "RUNNING"
    world.add_stray(world.enqueue("lost", net="net-a"), "fl-a", "7", token="tok-0")
    broken = _broken(world, mended)
    _rounds(world, 2)
    assert _state(world, "fl-a") == NetState.MISCONFIGURED
    clock.advance(600)
    broken[0] = False  # fixed, and the workers restarted; the SuperLink never answers
    server.up = False
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, clock(), at_start=True)
    seen = _rounds(world, 10)  # five minutes: the settling start after the fix, given up
    assert any(replicas for _, replicas in seen), "no settling start after the fix"
    clock.advance(-3 * 3600)
    starts = _starts(_hours(world, 2))
    assert len(starts) <= 4, f"started {len(starts)} times in two hours: {starts}"

"""Drift seed 1617 (forced, round 13): a Flower net whose kit was fixed by a human, then its
SuperLink gone for good, then the dispatcher's clock stepped back hours behind both the
stray and the fix. The rest's "since the net last left MISCONFIGURED" read the fix's stamp
against settling starts stamped by the stepped clock, found none after it, and the net was
started every few rounds again (`settle-storm`). A strict xfail on 3b1e58f's code."""

from __future__ import annotations

from app.usecases import declared_nets
from models import NetState
from tests.unit.test_flower_stray_rest_clock_and_idle_runs import _broken
from tests.unit.test_flower_stray_settling import _hours, _rounds, _starts
from tests.unit.test_revived_strays import _net_state as _state
from tests.unit.test_revived_strays import _world


def test_a_clock_stepped_back_behind_a_kit_fix_does_not_start_the_net_every_few_rounds(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """fl-a holds a stray; its settling start finds the kit wrong (MISCONFIGURED); a human
    fixes it and restarts the workers, and from then on its SuperLink never answers: the
    net rests at zero between settling starts for two hours. Then the clock is stepped back
    five hours, behind the stray and the fix: at most the handful of starts the stepped
    clock's own rule allows, not one every few rounds."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    server = world.server("fl-a")
    server.statuses["7"] = "RUNNING"
    world.add_stray(world.enqueue("lost", net="net-a"), "fl-a", "7", token="tok-0")
    broken = _broken(world, "kit")
    _rounds(world, 2)
    assert _state(world, "fl-a") == NetState.MISCONFIGURED
    clock.advance(600)
    broken[0] = False  # fixed, and the workers restarted
    server.up = False  # ... and its SuperLink never answers again
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, clock(), at_start=True)
    assert _state(world, "fl-a") == NetState.STOPPED
    _hours(world, 2)
    clock.advance(-5 * 3600)
    starts = _starts(_hours(world, 2))
    assert len(starts) <= 4, f"started {len(starts)} times in two hours: {starts}"

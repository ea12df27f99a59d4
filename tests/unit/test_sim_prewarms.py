"""The bug-hunting sweep's prewarms (tests.sim.prewarms): hints and cancels in a third of the
worlds on a stream of their own, `cancel_prewarm` in the simulator's task table, and the
invariants that know holds (tests.sim.prewarm_invariants, idle-net-at-zero)."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import select

from app.sim.faults import CLEAN
from app.sim.simulation import Simulation
from app.sim.workload import JobSpec, NetSpec, PrewarmSpec, Workload, WorldSpec
from app.usecases import prewarm_holds
from models import Prewarm
from tests.sim.invariants import Checker
from tests.sim.prewarms import PREWARM_SHARE, with_prewarms
from tests.sim.worlds import random_world

pytestmark = pytest.mark.unit


def _world() -> WorldSpec:
    return WorldSpec(nets=(NetSpec("net-a", idle_timeout_s=20.0), NetSpec("net-b")))


def _held_then_cancelled() -> Workload:
    """A 600 s hint on net-a at 0 s, cancelled at 30 s; one short job on net-b."""
    return Workload(
        jobs=(JobSpec("job-0", arrive_s=0.0, duration_s=20.0, net="net-b"),),
        prewarms=(
            PrewarmSpec(0.0, "pw-0", 600.0, net="net-a"),
            PrewarmSpec(30.0, "pw-0", 1.0, cancel=True),
            PrewarmSpec(31.0, "pw-unknown", 1.0, cancel=True),
        ),
    )


def _outcomes(sim: Simulation) -> dict[str, str | None]:
    return dict(sim.conn.execute("SELECT caller_key, outcome FROM prewarms WHERE NOT refused"))


def test_a_cancel_goes_through_the_task_table_and_the_world_stays_clean():
    sim = Simulation(_world(), _held_then_cancelled(), CLEAN, 0, checker=Checker(), tracing=True)
    result, outcomes = sim.run_then(_outcomes)
    assert result.ok, result.summary()
    assert outcomes == {"pw-0": "cancelled"}
    # The unknown key is answered as the real task answers it, not raised.
    assert any(
        "cancel_prewarm" in line and "{'rejected': \"no prewarm" in line for line in sim.lines
    )


def test_a_hold_kept_past_its_cancel_is_reported_as_an_idle_server(monkeypatch):
    # The product's one place that honours holds, made to ignore a cancel (the hold's
    # hold_until, not its end): the server stays up to 600 s + grace, the checker counts
    # the hold's end at the cancel.
    def ignoring_cancels(session, net_name, idle_since):
        ends = session.scalars(select(Prewarm.hold_until).where(Prewarm.net_name == net_name))
        return max([idle_since, *ends])

    monkeypatch.setattr(prewarm_holds, "idle_start", ignoring_cancels)
    result = Simulation(_world(), _held_then_cancelled(), CLEAN, 0, checker=Checker()).run()
    assert "idle-net-at-zero" in {v.invariant for v in result.violations}, result.summary()


def test_a_third_of_the_worlds_draw_prewarms_and_the_others_are_untouched():
    drawn = 0
    for seed in range(300):
        rng = random.Random(f"{seed}/workload")
        world = random_world(rng)
        workload = Workload(jobs=(JobSpec("job-0", 10.0),))
        new_world, new_workload = with_prewarms(seed, world, workload)
        if new_workload.prewarms:
            drawn += 1
            assert all(h.at_s <= workload.horizon_s for h in new_workload.prewarms)
        else:
            assert (new_world, new_workload) == (world, workload)
    assert abs(drawn / 300 - PREWARM_SHARE) < 0.08


def test_a_server_held_past_its_idle_bound_is_not_idle_while_its_hold_lives():
    # A 300 s hold (PREWARM_MAX_S 900) on a net whose idle bound is about 150 s: the net is
    # needed while it is held, and goes down within its grace after the hold's end.
    workload = Workload(
        jobs=(JobSpec("job-0", arrive_s=0.0, duration_s=20.0, net="net-b"),),
        prewarms=(PrewarmSpec(0.0, "pw-0", 300.0, net="net-a"),),
    )
    sim = Simulation(_world(), workload, CLEAN, 0, checker=Checker())
    result, outcomes = sim.run_then(_outcomes)
    assert result.ok, result.summary()
    assert outcomes == {"pw-0": "expired"}
    assert result.stats["sim_s"] > 300

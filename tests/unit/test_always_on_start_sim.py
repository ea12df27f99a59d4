"""The checker's `start-never-outage` (tests.sim.always_on_starts): an always-on net left
STARTING with no job, its server never up, is an OUTAGE past its readiness deadline and a
reconcile round. The sweep's worlds reach a job-less always-on STARTING past its deadline only
briefly (chaos seeds 2, 8, 22 of 0-50: the server answered within 43 s), so this world is
built by hand: an always-on ECS net whose platform fails every start, claimed by a job that
flip-api aborts while its server is still not answering."""

from __future__ import annotations

import pytest

from app.sim.faults import CLEAN
from app.sim.simulation import Simulation
from app.sim.workload import CallerEvent, JobSpec, NetSpec, Workload, WorldSpec
from app.usecases import net_repairs
from tests.sim.invariants import Checker

pytestmark = pytest.mark.unit


def _never_up() -> Simulation:
    world = WorldSpec(nets=(NetSpec("net-a"),), per_job_fl_server=False)
    workload = Workload(
        jobs=(JobSpec("job-0", arrive_s=0.0),),
        events=(CallerEvent(5.0, "job-0", "abort"),),
    )
    return Simulation(world, workload, CLEAN.with_(driver_failure=1.0), 0, checker=Checker())


def _net_a(sim: Simulation) -> str:
    return str(sim.conn.execute("SELECT state FROM nets WHERE name = 'net-a'").fetchone()[0])


def test_a_start_that_never_comes_up_ends_in_an_outage_and_the_world_stays_clean():
    result, state = _never_up().run_then(_net_a)
    assert result.ok, result.summary()
    assert state == "OUTAGE"


def test_a_start_left_starting_for_ever_is_reported(monkeypatch):
    # The watch before the fix: a STARTING always-on net was skipped whatever its age.
    monkeypatch.setattr(net_repairs, "overdue_start", lambda rt, name, server: "")
    result, state = _never_up().run_then(_net_a)
    assert state == "STARTING"
    assert [v.invariant for v in result.violations] == ["start-never-outage"]

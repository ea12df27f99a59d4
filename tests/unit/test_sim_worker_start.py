"""The simulator's worker start (app/sim/worker_start.py): the world's check of each net's
files, then the product's own start transaction (`declared_nets.prepare_at_start`), and a
kit that dials another server met by the net's client as a real one meets it."""

from __future__ import annotations

import pytest

from app.adapters import net_check
from app.errors import AdminMisconfigured, FilesNameAnotherServer, ServerUnavailable
from app.sim.faults import CLEAN
from app.sim.flower_admin import admin_for
from app.sim.simulation import Simulation
from app.sim.workload import JobSpec, NetSpec, Workload, WorldSpec
from tests.sim.invariants import Checker

pytestmark = pytest.mark.unit


def _sim() -> Simulation:
    world = WorldSpec(nets=(NetSpec("net-a"), NetSpec("net-b")))
    jobs = (JobSpec("a", arrive_s=5.0, duration_s=20.0, net="net-a"),)
    return Simulation(world, Workload(jobs=jobs, horizon_s=60.0), CLEAN, seed=1, checker=Checker())


def _nets(sim: Simulation) -> dict[str, tuple[str, str | None]]:
    rows = sim.conn.execute("SELECT name, state, last_error FROM nets").fetchall()
    return {name: (state, error) for name, state, error in rows}


def test_a_start_that_finds_a_kit_dialling_another_server_marks_the_net_until_a_fixed_one():
    sim = _sim()
    sim.cluster.servers["net-a"].kit_elsewhere = "net-a-other.example:8003"
    sim.restart_worker(0, "redeploy with the wrong kit")
    nets = _nets(sim)
    assert nets["net-a"][0] == "MISCONFIGURED"
    assert "dials net-a-other.example:8003" in str(nets["net-a"][1])
    assert nets["net-b"] == ("STOPPED", None)
    assert list(sim.starts.found_wrong) == ["net-a"]
    sim.restart_worker(1, "restarted, the kit still wrong")
    assert _nets(sim)["net-a"][0] == "MISCONFIGURED"
    # No move out of MISCONFIGURED in between: the start's one transaction.
    moves = sim.conn.execute(
        "SELECT from_state, to_state FROM net_events WHERE net_name = 'net-a'"
    ).fetchall()
    assert [m for m in moves if m[0] == "MISCONFIGURED"] == []
    sim.cluster.servers["net-a"].kit_elsewhere = None
    sim.restart_worker(0, "a human fixed the kit")
    assert _nets(sim)["net-a"] == ("STOPPED", None)
    assert sim.starts.found_wrong == {}
    result = sim.run()  # the job pinned to net-a runs once the kit is fixed
    assert result.ok, result.summary()
    assert sim.job_states() == {"a": "COMPLETED"}


@pytest.mark.parametrize(
    ("answer", "error"), [("unreachable", ServerUnavailable), ("refused", AdminMisconfigured)]
)
def test_the_nets_client_meets_what_the_other_host_gives(answer: str, error: type) -> None:
    sim = _sim()
    server = sim.cluster.servers["net-a"]
    server.kit_elsewhere, server.kit_answer = "net-a-other.example:8003", answer
    assert not server.reachable(sim.clock.t)
    with pytest.raises(error, match=r"net-a-other\.example:8003"):
        admin_for(sim.cluster, sim.settings.net("net-a")).server_start_time()
    server.kit_elsewhere = None
    assert sim.run().ok


def test_the_start_records_what_it_found_as_the_product_does_until_fixed_and_per_seed():
    """Both simulated workers share one record (net_check.record_start_check): a start that
    finds the kit wrong makes every worker's client refuse; one with it fixed clears it; the
    end of a simulation clears it too, so a sweep's next seed does not inherit it."""
    sim = _sim()
    sim.cluster.servers["net-a"].kit_elsewhere = "net-a-other.example:8003"
    sim.restart_worker(0, "redeploy with the wrong kit")
    assert "net-a-other.example:8003" in str(net_check.found_wrong("net-a"))
    with pytest.raises(FilesNameAnotherServer):
        sim.workers[1].admin("net-a").server_start_time()
    sim.cluster.servers["net-a"].kit_elsewhere = None
    sim.restart_worker(1, "a human fixed the kit")
    assert net_check.found_wrong("net-a") is None
    sim.cluster.servers["net-a"].kit_elsewhere = "net-a-other.example:8003"
    sim.restart_worker(0, "the wrong kit again")
    sim.cluster.servers["net-a"].kit_elsewhere = None  # the world ends with it recorded
    sim.run()
    assert net_check.found_wrong("net-a") is None


def test_a_kit_that_reaches_another_nets_server_gets_its_answers() -> None:
    sim = _sim()
    server = sim.cluster.servers["net-a"]
    server.kit_elsewhere, server.kit_answer, server.kit_other = "net-b:8003", "another", "net-b"
    sim.cluster.servers["net-b"].start(sim.clock.t - 100.0, sim.cluster.host.rng)
    client = admin_for(sim.cluster, sim.settings.net("net-a"))
    assert client.live_runs() == frozenset()  # net-b's, which runs none
    server.kit_elsewhere = server.kit_other = None

"""Flower nets in the simulator (issue 38): a world whose nets include a Flower SuperLink runs
its jobs through the product's real use cases with the checker on, beside an NVFLARE net,
and the checker catches a defect on a path only Flower nets take."""

from __future__ import annotations

import random

import pytest

from app.sim import superlink
from app.sim.faults import CLEAN
from app.sim.flower_admin import FlowerSimAdmin
from app.sim.report import Result
from app.sim.simulation import Simulation
from app.sim.workload import CallerEvent, JobSpec, NetSpec, Workload, WorldSpec
from app.usecases import revived_runs
from tests.sim.invariants import Checker
from tests.sim.seeds import with_flower
from tests.sim.worlds import random_world


def _run(world: WorldSpec, workload: Workload, **flower: object) -> tuple[Simulation, Result]:
    sim = Simulation(world, workload, CLEAN, seed=3, checker=Checker())
    for key, value in flower.items():
        setattr(sim.cluster.servers["net-f"], key, value)
    return sim, sim.run()


def test_a_flower_world_runs_its_jobs_and_scales_to_zero() -> None:
    world = WorldSpec(nets=(NetSpec("net-f", backend="flower"), NetSpec("net-a")))
    jobs = (
        JobSpec("f1", arrive_s=5.0, duration_s=40.0, net="net-f"),
        JobSpec("a", arrive_s=8.0, duration_s=30.0, net="net-a"),
        JobSpec("f2", arrive_s=20.0, duration_s=25.0, net="net-f"),
        JobSpec("f3", arrive_s=30.0, duration_s=None, net="net-f"),  # runs until stopped
    )
    events = (CallerEvent(0.0, "f3", "abort", on_state="RUNNING"),)
    sim, result = _run(world, Workload(jobs=jobs, events=events, horizon_s=150.0))

    assert result.ok, result.summary()
    assert sim.settings.net("net-f").backend == "flower"
    assert sim.job_states() == {
        "f1": "COMPLETED",
        "a": "COMPLETED",
        "f2": "COMPLETED",
        "f3": "ABORTED",
    }
    assert [sim.cluster.replicas(n) for n in ("net-f", "net-a")] == [0, 0]
    t = sim.clock.t
    records = sorted(superlink.record(r, t)[:2] for r in sim.cluster.runs if r.net == "net-f")
    assert records == [
        ("finished", "completed"),
        ("finished", "completed"),
        ("finished", "stopped"),
    ]
    assert all(r.nvflare_id.isdigit() for r in sim.cluster.runs if r.net == "net-f")


def test_a_superlink_restarted_under_a_run_with_its_database_requeues_the_job() -> None:
    """The run's record survives and reads running until its task expires (30-60 s), then
    LOST: the job is requeued (LOST_JOB_POLICY) and completes on its next run, one live run
    at a time. With a short grace and 5 s rounds, the checker's bound for settling a dead
    run (30 s) is shorter than the expiry: it counts from when the record can tell."""
    net = NetSpec("net-f", kind="static", backend="flower", keeps_jobs=True)
    world = WorldSpec(nets=(net,), housekeeping_interval_s=5.0, server_lost_grace_s=5.0)
    workload = Workload(jobs=(JobSpec("f", arrive_s=5.0, duration_s=60.0),), horizon_s=150.0)
    sim = Simulation(world, workload, CLEAN, seed=3, checker=Checker())
    sim.at(40.0, "the SuperLink is killed", lambda: sim.cluster.crash("net-f", sim.clock.t, 3.0))
    result, requeued = sim.run_then(lambda s: [r for (r,) in s.conn.execute(REQUEUES)])

    assert result.ok, result.summary()
    assert sim.job_states() == {"f": "COMPLETED"}
    first, second = sim.cluster.runs
    assert first.killed_at == 40.0 and first.expires_at is not None
    assert superlink.record(first, sim.clock.t)[2] == superlink.EXPIRED
    assert second.completed(sim.clock.t)
    assert len(requeued) == 1 and superlink.EXPIRED in requeued[0], requeued


REQUEUES = "SELECT reason FROM job_events WHERE to_state = 'QUEUED' AND from_state IS NOT NULL"


def _lost_replies() -> tuple[WorldSpec, Workload]:
    world = WorldSpec(nets=(NetSpec("net-f", backend="flower"),))
    return world, Workload(jobs=(JobSpec("f", arrive_s=5.0, duration_s=40.0),), horizon_s=150.0)


def test_a_lost_submit_reply_on_a_flower_net_starts_one_run() -> None:
    """Every start-run's reply is lost for the first minute: the dispatch's retries find the
    run by its token (the adapter's lookup) instead of starting another."""
    sim, result = _run(*_lost_replies(), reply_loss=[(0.0, 60.0)])
    assert result.ok, result.summary()
    assert sim.job_states() == {"f": "COMPLETED"}
    assert len(sim.cluster.runs) == 1


def test_the_checker_sees_a_second_run_when_the_lookup_after_a_lost_reply_is_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planted bug on a Flower-only path: the adapter's lookup of the token before a
    start-run switched off, a retry after a lost reply starts the job a second time (and
    the monitor's stop of the runs a job does not count, the defence behind it, off too:
    it stops that run within a round, and the checker, rightly, sees nothing then)."""
    monkeypatch.setattr(FlowerSimAdmin, "_started_run", lambda self, token: None)
    monkeypatch.setattr(revived_runs, "stop_uncounted_runs", lambda *_a, **_k: [])
    sim, result = _run(*_lost_replies(), reply_loss=[(0.0, 60.0)])
    invariants = {v.invariant for v in result.violations}
    assert {"one-live-run", "one-run-per-server"} <= invariants, result.summary()
    assert len({r.token for r in sim.cluster.runs}) < len(sim.cluster.runs)


def test_a_third_of_the_worlds_make_one_net_a_flower_net() -> None:
    worlds = [
        with_flower(seed, random_world(random.Random(f"{seed}/workload"))) for seed in range(90)
    ]
    flower = [sum(n.backend == "flower" for n in w.nets) for w in worlds]
    assert set(flower) == {0, 1}
    assert 20 <= sum(flower) <= 40


def test_a_run_pending_in_the_database_of_a_superlink_taken_down_never_runs_beside_the_next():
    """The SuperLink (with its state database) dies while the job's run is still pending,
    and stays down past the grace: the job is requeued, its run kept as a stray and, the
    net taken down, taken for gone with its server. But a pending run waits in the database
    and the next SuperLink's SuperExec starts it (flwr 1.42, `SuperLink.start`): the run
    of the earlier attempt must be stopped before the job's next submit on that SuperLink,
    never run beside it."""
    net = NetSpec("net-f", backend="flower", keeps_jobs=True)  # scale-to-zero
    world = WorldSpec(nets=(net,), housekeeping_interval_s=5.0, server_lost_grace_s=5.0)
    workload = Workload(jobs=(JobSpec("f", arrive_s=5.0, duration_s=60.0),), horizon_s=400.0)
    sim = Simulation(world, workload, CLEAN, seed=3, checker=Checker())
    crashed: list[float] = []

    def crash_while_pending() -> None:
        t = sim.clock.t
        runs = [r for r in sim.cluster.runs if r.net == "net-f"]
        if runs and superlink.record(runs[0], t)[0] == "pending":
            crashed.append(t)
            sim.cluster.crash("net-f", t, 120.0)  # down for two minutes
        elif not runs:
            sim.at(t + 0.05, "watch for the run", crash_while_pending)

    sim.at(5.0, "watch for the run", crash_while_pending)
    result = sim.run()

    assert crashed, "the run was never seen pending"
    assert result.ok, result.summary()
    assert sim.job_states() == {"f": "COMPLETED"}
    first, second = sim.cluster.runs
    assert superlink.record(first, sim.clock.t)[1] == "stopped"
    assert second.completed(sim.clock.t)

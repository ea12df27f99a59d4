"""The monitor's stop of the live runs a Flower net's job does not count
(`revived_runs.stop_uncounted_runs`): it never holds up the round's own work, a stop that
did not land is not counted, a net held FINISHING is covered, and a job claimed and
submitted during the round keeps its run (the stop's first version failed three of these:
tests/sim/FINDINGS.md, round 10)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from app.adapters.backend import AbortOutcome, AbortResult
from app.errors import ServerUnavailable
from app.usecases import abort, dispatch, monitor, records, revived_runs
from models import JobState, ReasonCode, StrayRun
from tests.unit.test_revived_strays import _world


def _running(world, net: str = "fl-a") -> tuple[str, str]:
    """A job RUNNING on the Flower net: its id and its run."""
    job = world.enqueue("a", net=net)
    world.run_pipeline(job)
    assert world.job(job).state == JobState.RUNNING
    return job, world.job(job).nvflare_job_id


def test_an_unexpected_error_listing_live_runs_does_not_stop_the_round_s_own_work(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    job, _ = _running(world)
    with world.rt.sessions.begin() as session:
        net = records.get_net(session, "fl-a")
        net.unreachable_since = clock() - timedelta(seconds=5)  # a blip, over now
        net.server_start_time = None  # unknown at dispatch: the monitor learns it

    def broken() -> frozenset[str]:
        raise RuntimeError("a reply the client did not expect")

    world.admin("fl-a").live_runs = broken  # type: ignore[method-assign]
    outcomes = monitor.monitor_running_jobs(world.rt)
    assert outcomes[str(job)] == "running", outcomes
    net = world.net("fl-a")
    assert net.unreachable_since is None, "the server answered: its blip is over"
    assert net.server_start_time == world.server("fl-a").start_time


def test_a_stop_that_did_not_land_is_not_reported_stopped(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    _, run = _running(world)
    world.server("fl-a").statuses["nv-9"] = "RUNNING"  # a later run of the token, say

    def unreachable(run_id: str) -> AbortResult:
        # FlowerControlClient.abort's answer when the stop-run call cannot reach the SuperLink.
        return AbortResult(AbortOutcome.NOTHING_TO_ABORT, "SuperLink unavailable: refused")

    world.admin("fl-a").abort = unreachable  # type: ignore[method-assign]
    assert revived_runs.stop_uncounted_runs(world.rt, "fl-a", [run]) == []
    assert "nv-9" in world.admin("fl-a").live_runs()


def _next_job_submitting(world, job_a: str, run_a: str, job_b: str) -> str:
    """Between the round's read and its live-runs list: A's run completes and A is settled
    (its net freed), B is claimed onto the net and submits, its run started on the server
    but not recorded yet. B's run."""
    server = world.server("fl-a")
    server.statuses[run_a] = "FINISHED:COMPLETED"
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session, job_a, JobState.COMPLETED, "done", world.clock(), code=ReasonCode.RUN_COMPLETED
        )
    world.run_until_ready(job_b)
    with world.rt.sessions.begin() as session:
        token = records.get_job(session, job_b).start_dispatch(world.clock())
    server.submitted[token] = "nv-7"
    server.statuses["nv-7"] = "RUNNING"
    server.statuses["nv-9"] = "RUNNING"  # a run no job counts (after B's readiness stop)
    return "nv-7"


@pytest.mark.parametrize("recorded_before_read", [True, False])
def test_a_job_claimed_and_submitted_during_the_round_keeps_its_run(
    tmp_path, job_root, sqlite_factory, clock, recorded_before_read: bool
) -> None:
    """Held: the round watched A's run; A ends and B's submit lands before the list. B's run,
    recorded before the jobs are read (RUNNING) or not yet (DISPATCHING), is never stopped;
    a run nobody counts is stopped only once B's is recorded."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    job_a, run_a = _running(world)
    job_b = world.enqueue("b", net="fl-a")
    server = world.server("fl-a")
    raced: list[str] = []
    server.on_start_time = lambda: raced.append(_next_job_submitting(world, job_a, run_a, job_b))
    admin = world.admin("fl-a")
    listed = admin.live_runs

    def list_then_record() -> frozenset[str]:
        live = listed()
        if raced and recorded_before_read and "nv-7" in live:
            assert dispatch.dispatch(world.rt, job_b, "fl-a", world.job(job_b).attempts).step
        return live

    admin.live_runs = list_then_record  # type: ignore[method-assign]
    monitor.monitor_running_jobs(world.rt)
    assert "nv-7" not in server.aborted
    assert server.aborted == (["nv-9"] if recorded_before_read else [])
    assert world.job(job_b).state == (
        JobState.RUNNING if recorded_before_read else JobState.DISPATCHING
    )


def test_a_stray_run_the_monitor_stops_still_settles_on_the_server_s_answer(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Held: a stray recorded beside the net's running job (a submit that landed after its
    job moved on) has its run stopped by the monitor; the stray row stays until settling,
    which then finds the run over and forgets it (its start window first, as before)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    job, run = _running(world)
    world.server("fl-a").statuses["nv-9"] = "RUNNING"
    world.add_stray(world.enqueue("old", net="net-a"), "fl-a", "nv-9", token="tok-old")
    with world.rt.sessions.begin() as session:
        stray = session.scalars(select(StrayRun)).one()
        stray.settle_after = clock() + timedelta(seconds=30)
    monitor.monitor_running_jobs(world.rt)
    assert world.server("fl-a").aborted == ["nv-9"] and world.job(job).state == JobState.RUNNING
    assert "nv-9" not in world.admin("fl-a").live_runs() and run in world.admin("fl-a").live_runs()
    assert abort.settle_stray_runs(world.rt, "fl-a") == 1, "held for its window"
    clock.advance(31)
    assert abort.settle_stray_runs(world.rt, "fl-a") == 0


def test_a_later_run_left_by_a_blip_in_the_verdict_round_is_stopped_during_the_hold(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    world = _world(tmp_path, job_root, sqlite_factory, clock, RELEASE_AFTER="reported")
    job, run = _running(world)
    server, admin = world.server("fl-a"), world.admin("fl-a")
    server.statuses["nv-9"] = "RUNNING"  # a later run of the token, its step's retries spent
    server.statuses[run] = "FINISHED:COMPLETED"
    listed = admin.live_runs

    def blip() -> frozenset[str]:
        raise ServerUnavailable("refused, this once")

    admin.live_runs = blip  # type: ignore[method-assign]
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job).state == JobState.FINISHING
    admin.live_runs = listed  # type: ignore[method-assign]
    for _ in range(3):  # the SuperLink answers every round from now on
        clock.advance(30)
        monitor.monitor_running_jobs(world.rt)
    assert world.job(job).state == JobState.FINISHING, "held for flip-api's report"
    assert "nv-9" not in admin.live_runs(), "a run no job counts lives on the held net"

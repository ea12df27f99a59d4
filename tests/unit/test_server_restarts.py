"""A server restarted under a run. A run killed with its server process (NVFLARE 2.9 reads it
RUNNING for ever and refuses its abort: "Job ... is not running.") is over, and is taken for
over only on the server's own answer, never on a start time the net stored: a review of seed
499's first fix showed that start time need not be that of the process the run lives on. A
run that finished before the restart keeps its verdict, read once; a run the new process
lists lives on; and a start time that could not be read after the submit still lets the
next one show the restart."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import select

from app import names
from app.adapters.backend import AbortOutcome, AbortResult
from app.errors import ServerUnavailable, UnknownAdminError
from app.usecases import abort, dispatch, intake, monitor
from models import JobState, StrayRun
from tests.fakes import FakeAdmin
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, dispatch_through_a_start_time_blip, world_of

OLD, NEW = 1000.0, 1500.0  # the start times of the process before and after a restart


def _strays(world) -> list[StrayRun]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def _no_start_time() -> float:
    # What the real client raises for a server just booted that gives no start time yet.
    raise UnknownAdminError("server reported no start time")


def _submitted_on_a_restarted_server_that_gives_no_start_time_yet(world, job_id):
    """Readiness saw the old process; it restarted before the submit, which the new process
    accepted, but just booted it gives no start time yet."""
    server = world.server("fixed")
    server.start_time = OLD
    net, attempt = world.run_until_ready(job_id)
    server.restart(NEW)  # between readiness and the submit: no run to kill yet
    admin = world.admin("fixed")
    real = admin.server_start_time
    admin.server_start_time = _no_start_time  # type: ignore[method-assign]
    assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.DONE
    assert server.statuses["nv-1"] == "RUNNING" and "nv-1" not in server.killed
    return real


@pytest.fixture
def failing(tmp_path, job_root, sqlite_factory, clock) -> World:
    """The unit world's nets with LOST_JOB_POLICY=fail."""
    nets = [
        net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120),
        net_decl(tmp_path, "fixed", "static"),
    ]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, LOST_JOB_POLICY="fail")


def test_a_run_on_a_process_readiness_did_not_see_is_aborted_before_its_job_runs_again(world):
    """Lost past the grace (no start time), the run is kept as a stray; the server answers
    again and the live run is aborted, not taken for dead, before the job is claimed."""
    job_id = world.enqueue("j", net="fixed")
    real = _submitted_on_a_restarted_server_that_gives_no_start_time_yet(world, job_id)
    server = world.server("fixed")
    monitor.monitor_running_jobs(world.rt)  # no start time: unwatchable
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(31)  # past SERVER_LOST_GRACE_S
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED  # its run kept as a stray
    world.admin("fixed").server_start_time = real  # type: ignore[method-assign]

    abort.settle_stray_runs(world.rt, "fixed")
    claims = [c.job_id for c in dispatch.claim_and_start(world.rt)]

    assert server.aborted == ["nv-1"]
    assert claims == [job_id] and _strays(world) == []


def test_a_run_on_a_process_the_stored_start_time_is_not_of_is_watched_not_taken_for_dead(
    world,
):
    """The net kept readiness's start time (the read after the submit failed): the server
    answers with another, but lists the run among its process's live runs, so the stored
    start time was stale, not the run dead: the job stays RUNNING and the net learns the
    process's start time (a later restart is seen against it)."""
    job_id = world.enqueue("j", net="fixed")
    real = _submitted_on_a_restarted_server_that_gives_no_start_time_yet(world, job_id)
    assert world.net("fixed").server_start_time == OLD
    world.admin("fixed").server_start_time = real  # type: ignore[method-assign]  # NEW now
    server = world.server("fixed")

    monitor.monitor_running_jobs(world.rt)

    assert world.job(job_id).state == JobState.RUNNING
    assert world.net("fixed").server_start_time == NEW
    assert _strays(world) == [] and server.aborted == []
    server.restart()  # now a real restart under it
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED


def test_a_restart_under_a_job_settles_its_dead_run_at_once_and_keeps_the_server(world):
    """The common case: the run died with the old process. Its stray is settled on the
    server's "not running" as soon as the settle the monitor sent runs; a scale-to-zero
    net whose server answers is not taken down for it."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").restart()
    world.outbox.sent.clear()

    monitor.monitor_running_jobs(world.rt)

    assert world.job(job_id).state == JobState.QUEUED
    assert world.driver("net-a").replicas == 1
    assert (names.SETTLE_STRAY_RUNS, {"net_name": "net-a"}) in world.outbox.sent
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert world.server("net-a").aborted == []
    assert [c.job_id for c in dispatch.claim_and_start(world.rt)] == [job_id]


def test_a_run_killed_by_a_restart_right_after_its_submit_does_not_hold_its_net_for_ever(
    world,
):
    """The net keeps the new process's start time for a run that died with the old one,
    which reads RUNNING for ever: its own start time, before the new process's, says it
    died, so the next monitor round resolves it (not MAX_RUN_S, a day later); its abort,
    refused as not running, settles its stray, and the net takes the next job."""
    job_id = world.enqueue("j", net="fixed")
    server = world.server("fixed")
    server.start_time = OLD
    net, attempt = world.run_until_ready(job_id)
    server.on_start_time = lambda: server.restart(NEW)  # killed right after the submit
    assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.DONE
    assert "nv-1" in server.killed
    world.enqueue("next", net="fixed")

    monitor.monitor_running_jobs(world.rt)

    assert world.job(job_id).state == JobState.QUEUED  # LOST_JOB_POLICY=requeue
    assert abort.settle_stray_runs(world.rt, "fixed") == 0  # "not running": it is over
    assert _strays(world) == []
    assert [c.job_id for c in dispatch.claim_and_start(world.rt)] == [job_id]


def test_a_stray_an_unconfirmed_abort_left_goes_with_its_restarted_server(world):
    job_id = world.enqueue("j", net="fixed")
    server = world.server("fixed")
    world.run_pipeline(job_id)
    admin = world.admin("fixed")
    # The abort is accepted, then the server is killed before it can say the run stopped.
    admin.abort = lambda run: AbortResult(AbortOutcome.ABORTED)  # type: ignore[method-assign]
    real_status = admin.job_status

    def gone(_: str):
        raise ServerUnavailable("killed")

    admin.job_status = gone  # type: ignore[method-assign]
    assert intake.request_abort(world.rt, job_id, "user").decision.needs_server_abort
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    assert len(_strays(world)) == 1
    server.restart()  # nv-1 dies with the old process; 2.9 reads it RUNNING for ever
    admin.job_status = real_status  # type: ignore[method-assign]
    del admin.abort  # the fake's own abort: refused, not running
    waiting = world.enqueue("next", net="fixed")

    assert abort.settle_stray_runs(world.rt, "fixed") == 0

    assert [c.job_id for c in dispatch.claim_and_start(world.rt)] == [waiting]


def test_a_run_killed_before_its_start_time_was_learned_frees_its_always_on_net(world):
    job_id = world.enqueue("j", net="fixed")
    server = world.server("fixed")
    admin = world.admin("fixed")
    real_ready = admin.is_ready
    admin.is_ready = lambda sites: replace(  # type: ignore[method-assign]
        real_ready(sites), server_start_time=None
    )
    admin.server_start_time = _no_start_time  # type: ignore[method-assign]
    world.run_pipeline(job_id)  # just booted: no start time yet
    server.up = False  # killed before the monitor could learn it
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(31)  # past SERVER_LOST_GRACE_S
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED  # its run kept as a stray
    server.up = True
    server.restart()  # a new process answers
    del admin.is_ready, admin.server_start_time

    assert abort.settle_stray_runs(world.rt, "fixed") == 0

    assert [c.job_id for c in dispatch.claim_and_start(world.rt)] == [job_id]


def test_an_abort_of_a_run_its_server_runs_in_no_process_ends_the_job_without_a_stray(world):
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    world.server("fixed").restart()  # nv-1 reads RUNNING for ever
    assert intake.request_abort(world.rt, job_id, "user").decision.needs_server_abort
    waiting = world.enqueue("next", net="fixed")

    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED

    assert _strays(world) == []
    assert [c.job_id for c in dispatch.claim_and_start(world.rt)] == [waiting]


def test_nothing_to_abort_from_a_server_that_still_reads_the_run_running_keeps_the_stray(
    world,
):
    """ "Nothing to abort" also covers a blip (the status read inside the abort failed): only
    the server's "not running" answer, or a status that is over, settles a stray."""
    job_id = world.enqueue("j", net="fixed")
    world.add_stray(job_id, "fixed", "nv-9")
    world.server("fixed").statuses["nv-9"] = "RUNNING"
    world.admin("fixed").abort = lambda run: AbortResult(  # type: ignore[method-assign]
        AbortOutcome.NOTHING_TO_ABORT, "server unavailable"
    )

    assert abort.settle_stray_runs(world.rt, "fixed") == 1


def test_a_run_that_completed_before_a_restart_the_monitor_saw_late_is_not_run_again(world):
    """The run completes; the always-on server restarts before the monitor's next round.
    The server, answering now, says the run COMPLETED (its record survives the restart):
    the job is COMPLETED, as the unwatchable path does for a finished run "whatever its
    start time", never requeued and run a second time."""
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    server = world.server("fixed")
    server.statuses["nv-1"] = "FINISHED:COMPLETED"
    server.restart()  # after the run ended: nothing to kill

    monitor.monitor_running_jobs(world.rt)
    abort.settle_stray_runs(world.rt, "fixed")  # the settle the monitor sent

    assert world.job(job_id).state == JobState.COMPLETED
    assert [c.job_id for c in dispatch.claim_and_start(world.rt)] == []


def test_a_healthy_run_is_not_failed_as_lost_on_a_start_time_readiness_stored(failing):
    """Readiness saw the old process; it restarted before the submit, which the new process
    accepted and runs; the read after the submit failed (just booted). The monitor then
    reads the new process's start time. Nothing restarted under the job: the server,
    answering now, runs it (nvflare's `show_stats` or the abort's own answer could tell a
    run killed with an earlier process from a live one), so the job must not be FAILED as
    lost nor its run aborted."""
    world = failing
    job_id = world.enqueue("j", net="fixed")
    real = _submitted_on_a_restarted_server_that_gives_no_start_time_yet(world, job_id)
    admin = world.admin("fixed")
    admin.server_start_time = real  # type: ignore[method-assign]
    assert world.net("fixed").server_start_time == OLD
    server = world.server("fixed")

    monitor.monitor_running_jobs(world.rt)
    abort.settle_stray_runs(world.rt, "fixed")  # the settle the monitor sent

    assert (world.job(job_id).state, server.aborted) == (JobState.RUNNING, [])


def test_a_run_killed_by_a_restart_the_monitor_could_not_see_frees_its_always_on_net(world):
    """Seed 499 (servers): a job runs on an always-on net; its server process is killed and
    restarted, and for a while after boot gives no start time, which the monitor cannot tell
    from a server that does not answer: past the grace the job is requeued and its run kept
    as a stray (it may still live). The server answers again, still reading the killed run
    RUNNING (NVFLARE 2.9 does so for ever) but refusing its abort as "not running": that
    answer settles the stray, and the job, pinned there, is claimed again (it waited for
    ever when only a status that is over could settle a stray)."""
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    server = world.server("fixed")
    server.up = False  # the process is gone: the admin side cannot tell it from a blip
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(31)  # past SERVER_LOST_GRACE_S
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED  # its run kept as a stray
    server.up = True
    server.restart()  # a new process answers; the run died with the old one

    abort.settle_stray_runs(world.rt, "fixed")
    claims = dispatch.claim_and_start(world.rt)

    assert [c.job_id for c in claims] == [job_id]


def test_a_start_time_unknown_after_submit_keeps_restart_detection(world):
    # tests/sim/FINDINGS.md, hole 3a
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    dispatch_through_a_start_time_blip(world, job_id)
    assert world.net("net-a").server_start_time == 1000.0
    world.server("net-a").restart(2000.0)  # the server restarted under the job
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED


def test_a_run_finished_across_a_restart_is_settled_on_the_one_status_read(world, monkeypatch):
    """After a restart, a run the new process reports finished is judged on that read
    (monitor._after_restart -> _verdict): a server that stops answering right after it
    does not turn a completed run into "status unknown" (nor, past MAX_RUN_S, an overrun
    FAILED). Pins the single read: before the rewrite a second status call decided."""
    job_id = world.enqueue("done-before-restart", net="net-a")
    world.run_pipeline(job_id)
    server = world.server("net-a")
    server.statuses[world.job(job_id).nvflare_job_id] = "FINISHED:COMPLETED"
    server.restart()
    real = FakeAdmin.job_status
    calls: list[str] = []

    def once_then_gone(admin: FakeAdmin, run: str) -> Any:
        calls.append(run)
        if len(calls) > 1:
            raise ServerUnavailable("connection reset")
        return real(admin, run)

    monkeypatch.setattr(FakeAdmin, "job_status", once_then_gone)
    world.clock.advance(world.rt.settings.max_run_s + 1)  # a second read would say overran
    verdicts = monitor.monitor_running_jobs(world.rt)
    job = world.job(job_id)
    assert job.state == JobState.COMPLETED, verdicts
    assert len(calls) == 1

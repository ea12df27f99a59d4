"""What monitor writes when a run ends: the job's reason is NVFLARE's own status (or why the
run is lost), and with RELEASE_AFTER=reported a completed run holds its server FINISHING."""

from __future__ import annotations

import json

from app.errors import UnknownAdminError
from app.settings import Settings
from app.usecases import monitor, reconciler
from models import JobState, NetState
from tests.fixtures.db import net_decl


def test_a_failed_run_fails_its_job_with_nvflares_status(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:EXECUTION_EXCEPTION"
    monitor.monitor_running_jobs(world.rt)
    job = world.job(job_id)
    assert (job.state, job.last_error) == (
        JobState.FAILED,
        "NVFLARE FINISHED:EXECUTION_EXCEPTION",
    )


def test_a_run_the_server_forgot_is_requeued_saying_so(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    del world.server("net-a").statuses["nv-1"]
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "requeued"}
    assert world.job(job_id).last_error == "the server does not know the run"


def test_an_overrun_whose_status_cannot_be_read_says_so(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)

    def unreadable(_: str):
        raise UnknownAdminError("odd reply")

    world.admin("net-a").job_status = unreadable  # type: ignore[method-assign]
    world.clock.advance(world.rt.settings.max_run_s + 1)
    monitor.monitor_running_jobs(world.rt)
    job = world.job(job_id)
    assert job.state == JobState.FAILED
    assert "exceeded the maximum run time (status unknown: odd reply)" in (job.last_error or "")


def test_with_release_after_reported_a_completed_run_holds_its_server(held_for_report):
    world = held_for_report
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    assert monitor.monitor_running_jobs(world.rt) == {
        str(job_id): "finishing: waiting for flip-api's results report"
    }
    assert world.job(job_id).state == JobState.FINISHING
    assert world.net("net-a").state == NetState.BUSY


def test_a_net_declared_by_a_redeploy_gets_its_row_from_reconcile(world, tmp_path, job_root):
    nets = [
        net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120),
        net_decl(tmp_path, "fixed", "static"),
        net_decl(tmp_path, "net-new", "ecs"),
    ]
    world.rt.settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps(nets),
        PER_JOB_FL_SERVER="true",
    )
    world.clock.advance(5)
    reconciler.reconcile(world.rt)
    net = world.net("net-new")
    assert (net.state, net.state_changed_at) == (NetState.STOPPED, world.clock())


def test_a_reconcile_that_crashes_on_one_net_is_recorded_there_and_repairs_the_others(world):
    world.driver("net-a").replicas = 1  # drift on net-a, to be repaired
    world.clock.advance(world.rt.settings.stuck_after_s + 1)

    def crash():
        raise RuntimeError("bug in a client")

    world.admin("fixed").server_state = crash  # type: ignore[method-assign]
    repaired = reconciler.reconcile(world.rt).repaired
    assert world.net("fixed").last_error == "reconcile: RuntimeError: bug in a client"
    assert "net-a: drift: STOPPED net had a server; scaled to 0" in repaired
    assert world.driver("net-a").replicas == 0


def test_a_run_the_server_forgot_is_lost_not_running_forever(world):
    # tests/sim/FINDINGS.md, hole 3 (second half)
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses.clear()
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED


def test_a_run_finished_while_the_start_time_cannot_be_read_is_settled_not_lost(world):
    # The simulator's sweep (seed 310): a restarted server answered job statuses but not its
    # start time; monitor took the run for lost, requeued it, and the job completed twice.
    from app.errors import ServerUnavailable

    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    admin = world.admin("net-a")
    world.server("net-a").statuses[world.job(job_id).nvflare_job_id] = "FINISHED:COMPLETED"

    def no_start_time() -> float:
        raise ServerUnavailable("server reported no start time")

    admin.server_start_time = no_start_time  # type: ignore[method-assign]
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    outcomes = monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.COMPLETED, outcomes
    assert outcomes == {str(job_id): "completed"}
    # No run is left unwatched: the net is not counted unreachable, nor its grace started.
    net = world.net("net-a")
    assert (net.unreachable_since, net.last_error) == (None, None)

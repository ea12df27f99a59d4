"""Review of the "not running" abort answer and of a restart under a job kept as a stray
(commits e3b13e8, 952246e): reproductions of what still breaks the README's promises."""

from __future__ import annotations

import pytest

from app.errors import UnknownAdminError
from app.usecases import abort, dispatch, monitor
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of

OLD, NEW = 1000.0, 1500.0  # the start times of the process before and after a restart


@pytest.fixture
def failing(tmp_path, job_root, sqlite_factory, clock) -> World:
    """The unit world's nets with LOST_JOB_POLICY=fail."""
    nets = [
        net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120),
        net_decl(tmp_path, "fixed", "static"),
    ]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, LOST_JOB_POLICY="fail")


def _no_start_time() -> float:
    # What the real client raises for a server just booted that gives no start time yet.
    raise UnknownAdminError("server reported no start time")


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
    assert [c.job_id for c in dispatch.assign_jobs(world.rt)] == []


def test_a_healthy_run_is_not_failed_as_lost_on_a_start_time_readiness_stored(failing):
    """Readiness saw the old process; it restarted before the submit, which the new process
    accepted and runs; the read after the submit failed (just booted). The monitor then
    reads the new process's start time. Nothing restarted under the job: the server,
    answering now, runs it (nvflare's `show_stats` or the abort's own answer could tell a
    run killed with an earlier process from a live one), so the job must not be FAILED as
    lost nor its run aborted."""
    world = failing
    job_id = world.enqueue("j", net="fixed")
    server = world.server("fixed")
    server.start_time = OLD
    net, attempt = world.run_until_ready(job_id)
    server.restart(NEW)  # between readiness and the submit: no run to kill yet
    admin = world.admin("fixed")
    real = admin.server_start_time
    admin.server_start_time = _no_start_time  # type: ignore[method-assign]
    assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.DONE
    admin.server_start_time = real  # type: ignore[method-assign]
    assert world.net("fixed").server_start_time == OLD
    assert server.statuses["nv-1"] == "RUNNING" and "nv-1" not in server.killed

    monitor.monitor_running_jobs(world.rt)
    abort.settle_stray_runs(world.rt, "fixed")  # the settle the monitor sent

    assert (world.job(job_id).state, server.aborted) == (JobState.RUNNING, [])

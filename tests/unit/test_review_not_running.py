"""A second review, of the "not running" abort answer and of a restart under a job kept as
a stray: its reproductions, fixed since (a restart decides nothing on the start time alone:
a finished run gets its verdict, a run the new process lists lives on)."""

from __future__ import annotations

import pytest

from app.errors import UnknownAdminError
from app.usecases import abort, dispatch, monitor
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of
from tests.unit.test_review_stray_restart import OLD
from tests.unit.test_review_stray_restart import (
    _submitted_on_a_restarted_server_that_gives_no_start_time_yet as submitted_across_a_restart,
)


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
    real = submitted_across_a_restart(world, job_id)
    admin = world.admin("fixed")
    admin.server_start_time = real  # type: ignore[method-assign]
    assert world.net("fixed").server_start_time == OLD
    server = world.server("fixed")

    monitor.monitor_running_jobs(world.rt)
    abort.settle_stray_runs(world.rt, "fixed")  # the settle the monitor sent

    assert (world.job(job_id).state, server.aborted) == (JobState.RUNNING, [])

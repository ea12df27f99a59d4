"""Which runs a monitor round watches, and how long a round waits for its nets."""

from __future__ import annotations

from app.usecases import housekeeping, intake, monitor
from models import JobState


def test_a_job_aborted_before_its_submit_landed_is_not_polled(world):
    """An ABORTING job with no run on the server yet gives the monitor nothing to ask."""
    job_id = world.stuck_in_dispatching("in-flight")
    intake.request_abort(world.rt, job_id, "user")
    assert world.job(job_id).state == JobState.ABORTING
    assert world.job(job_id).nvflare_job_id is None

    assert str(job_id) not in monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.ABORTING


def test_the_full_round_watches_a_run_no_queued_job_waits_for(world):
    """monitor_running_jobs settles a finished run even with no QUEUED job anywhere."""
    job_id = world.enqueue("alone", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"

    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.COMPLETED


def test_a_round_waits_longer_than_one_admin_command(world):
    """A net that answers just within the command timeout is not reported late."""
    timeout = world.rt.settings.admin_command_timeout_s
    assert housekeeping.round_deadline_s(world.rt) > timeout

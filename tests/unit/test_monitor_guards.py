"""Which runs a monitor round watches (an abort whose submit has not landed is left to the
reconciler, which bounds it by ABORT_TIMEOUT_S), and how long a round waits for its nets."""

from __future__ import annotations

import pytest

from app.usecases import housekeeping, intake, monitor, reconciler
from models import JobState


def test_a_job_aborted_before_its_submit_landed_is_not_polled(world):
    """An ABORTING job with no run on the server yet gives the monitor nothing to ask."""
    job_id = world.stuck_in_dispatching("in-flight")
    intake.request_abort(world.rt, job_id, "user")
    assert world.job(job_id).state == JobState.ABORTING
    assert world.job(job_id).nvflare_job_id is None

    assert str(job_id) not in monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.ABORTING


@pytest.mark.parametrize("entry", ["full round", "awaited poll"])
def test_an_abort_before_the_submit_landed_is_left_to_the_reconciler_and_bounded(world, entry):
    """monitor._watched no longer filters `nvflare_job_id IS NOT NULL` in SQL: an ABORTING
    job with no run yet reaches the Python filter, on both entry points (the awaited poll
    too, with a QUEUED job waiting for the net). Neither may take it for a lost run (a
    status asked for no id); app/usecases/README.md: 'aborting is bounded by
    ABORT_TIMEOUT_S': with the submit never landing, reconcile ends it ABORTED and takes the
    scale-to-zero server down (its token's run, had it landed, dies with it)."""
    job_id = world.stuck_in_dispatching("in-flight")
    intake.request_abort(world.rt, job_id, "user")
    world.enqueue("waiting", net="net-a")
    asked: list[str | None] = []
    admin = world.admin("net-a")
    read = admin.job_status

    def job_status(run: str):
        asked.append(run)
        return read(run)

    admin.job_status = job_status

    if entry == "full round":
        outcomes = monitor.monitor_running_jobs(world.rt)
    else:
        outcomes = monitor.monitor_awaited_runs(world.rt)
    assert (outcomes, asked) == ({}, [])
    assert world.job(job_id).state == JobState.ABORTING

    world.clock.advance(world.rt.settings.abort_timeout_s + 1)
    reconciler.reconcile(world.rt)
    assert world.job(job_id).state == JobState.ABORTED
    assert world.driver("net-a").replicas == 0  # the token's run, had it landed, is gone


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

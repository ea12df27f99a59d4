"""Requeueing gives an active job back to the queue without its run's identity (token, run
id, net), and never touches a job that is already over."""

from __future__ import annotations

from sqlalchemy import select

from app.usecases import records
from models import JobEvent, JobState, ReasonCode


def test_a_requeued_job_keeps_nothing_of_its_last_run(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        assert records.requeue_job(session, job_id, "server lost", world.clock())
    job = world.job(job_id)
    assert (job.state, job.attempts, job.last_error) == (JobState.QUEUED, 1, "server lost")
    assert (job.net_name, job.nvflare_job_id, job.submit_token) == (None, None, None)


def test_a_job_that_is_over_is_not_requeued(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_to_completion(job_id)
    with world.rt.sessions.begin() as session:
        assert not records.requeue_job(session, job_id, "late signal", world.clock())
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.COMPLETED, 0)


def test_a_job_out_of_attempts_fails_with_the_count_and_the_reason_in_its_history(world):
    """The FAILED move of a requeue past max_attempts says why in the job's history (the
    words flip-api and the job views show): how many attempts, and what ended the last."""
    job_id = world.enqueue("j", net="net-a", max_attempts=1)
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        assert not records.requeue_job(session, job_id, "server lost", world.clock())
    with world.rt.sessions() as session:
        last = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id.desc())
        ).first()
    assert last is not None
    assert (last.to_state, last.reason_code) == (JobState.FAILED, ReasonCode.MAX_ATTEMPTS)
    assert last.reason == "attempts exhausted (1 of 1): server lost"

"""A move the state table refuses says what was refused (the HTTP API answers it as a 409
with this text) and leaves the row and its history as they were."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from models import IllegalTransition, Job, JobEvent, JobState, Net, NetEvent, NetState, ReasonCode


def _stored_job(session, clock) -> Job:
    """A QUEUED job, flushed."""
    job = Job.new(
        caller_key="k",
        definition="d",
        required_sites=["s"],
        requested_net=None,
        priority=0,
        max_attempts=3,
        now=clock(),
    )
    session.add(job)
    session.flush()
    return job


def test_a_refused_job_move_names_the_job_and_the_move(clock, sqlite_factory):
    with sqlite_factory() as session:
        job = _stored_job(session, clock)
        with pytest.raises(IllegalTransition) as refused:
            job.transition(JobState.RUNNING, clock.advance(1), "skipping the queue")
        assert str(refused.value) == f"job {job.id}: QUEUED -> RUNNING is not allowed"
        assert (refused.value.current, refused.value.target) == (JobState.QUEUED, JobState.RUNNING)
        assert job.state == JobState.QUEUED
        assert session.scalar(select(func.count()).select_from(JobEvent)) == 1  # "enqueued"


def test_a_refused_net_move_names_the_net_and_the_move(clock, sqlite_factory):
    with sqlite_factory() as session:
        net = Net(name="net-a", state=NetState.STOPPED, state_changed_at=clock())
        session.add(net)
        session.flush()
        with pytest.raises(IllegalTransition) as refused:
            net.transition(NetState.BUSY, clock.advance(1), "a job without a server")
        assert str(refused.value) == "net net-a: STOPPED -> BUSY is not allowed"
        assert (refused.value.current, refused.value.target) == (NetState.STOPPED, NetState.BUSY)
        assert net.state == NetState.STOPPED
        assert session.scalar(select(func.count()).select_from(NetEvent)) == 0


@pytest.mark.parametrize("code", [None, ReasonCode.RUN_COMPLETED], ids=["no code", "wrong code"])
def test_a_terminal_move_without_its_reason_code_names_the_job_and_the_code(
    clock, sqlite_factory, code
):
    """QUEUED -> ABORTED is in the table, but only with a code REASONS lists for ABORTED: a
    move without one, or with another state's, is refused with the job and the code named."""
    with sqlite_factory() as session:
        job = _stored_job(session, clock)
        with pytest.raises(IllegalTransition) as refused:
            job.transition(JobState.ABORTED, clock.advance(1), "user", code=code)
        assert str(refused.value) == (
            f"job {job.id} (reason code {code}): QUEUED -> ABORTED is not allowed"
        )
        assert job.state == JobState.QUEUED

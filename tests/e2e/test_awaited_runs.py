"""A job queued behind a run starts within seconds of that run's end, on the real stack: a
real beat sends monitor_awaited_runs every AWAITED_POLL_S to a real Celery worker, which reads
the real NVFLARE server's run status. The full monitor round is made far slower than the jobs
(HOUSEKEEPING_INTERVAL_S 300 s: beat's first tick of an interval entry is one interval after
it starts, after both jobs have run), so only the awaited-run poll can see the first run end
in time."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from app.local.stack import LocalStack, StackOptions
from models import Job, JobEvent, JobState
from tests.fixtures.db import fresh_pg_database
from tests.fixtures.services import PrivateRedis

pytestmark = [pytest.mark.e2e, pytest.mark.nvflare]

RUN_S = 240  # generous bounds for a 2-core CI machine
AWAITED_POLL_S = 0.5
HOUSEKEEPING_S = 300.0  # the full monitor round (and assign, scale-down)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[LocalStack, datetime]]:
    before_beat = datetime.now(UTC)
    redis = PrivateRedis(tmp_path_factory.mktemp("redis"))
    redis.start()
    try:
        with fresh_pg_database("fld_e2e_awaited") as url:
            options = StackOptions(
                workdir=tmp_path_factory.mktemp("e2e-awaited"),
                database_url=url,
                broker_url=redis.url(),
                idle_timeout_s=5,
                ready_timeout_s=120,
                housekeeping_interval_s=HOUSEKEEPING_S,
                embedded_beat=False,
                extra_env={"AWAITED_POLL_S": str(AWAITED_POLL_S)},
            )
            with LocalStack(options) as running:
                yield running, before_beat
    finally:
        redis.stop()


def done(stack: LocalStack, job_id: uuid.UUID) -> Job | None:
    job = stack.job(job_id)
    return job if job is not None and job.state in (JobState.COMPLETED, JobState.FAILED) else None


def running(stack: LocalStack, job_id: uuid.UUID) -> Job | None:
    job = stack.job(job_id)
    return job if job is not None and job.state == JobState.RUNNING else None


def moved_at(stack: LocalStack, job_id: uuid.UUID, state: JobState) -> datetime:
    events = stack.read(
        lambda s: list(
            s.scalars(
                select(JobEvent)
                .where(JobEvent.job_id == job_id, JobEvent.to_state == state)
                .order_by(JobEvent.id)
            )
        )
    )
    assert events, f"job {job_id} never reached {state}"
    return events[0].at


def test_a_job_queued_behind_a_run_starts_soon_after_it_ends(stack):
    stack, before_beat = stack
    first = stack.enqueue("awaited-1")  # the enqueue kicks assign: no beat tick needed
    stack.wait_for(f"job {first} running", lambda: running(stack, first), RUN_S)
    second = stack.enqueue("awaited-2")  # queues: the one net is busy
    job = stack.wait_for(f"job {first} done", lambda: done(stack, first), RUN_S)
    assert job.state == JobState.COMPLETED, job.last_error
    # The second one's own end would be seen by the full round only (no job waits for it).
    stack.wait_for(f"job {second} running", lambda: running(stack, second), RUN_S)
    ended = moved_at(stack, first, JobState.COMPLETED)
    assigned = moved_at(stack, second, JobState.ASSIGNED)
    # The second waited in the queue for the first one's net (one net, one run at a time)
    # and was placed as soon as the first one's end was seen.
    assert assigned >= ended
    assert (assigned - ended).total_seconds() < 5
    # That end was seen long before the first full monitor round (at least HOUSEKEEPING_S
    # after beat started): by the awaited-run poll.
    seen_after_s = (ended - before_beat).total_seconds()
    print(f"first run's end seen {seen_after_s:.1f}s after the stack started")
    assert seen_after_s < HOUSEKEEPING_S

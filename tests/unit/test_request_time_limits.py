"""A caller's request whose database statement hangs past the task's time limits is kept
(found by round 16's reviewer: acknowledged away before, both tests failed on fd9709d)."""

from __future__ import annotations

from unittest import mock

import pytest
from celery.exceptions import Retry, SoftTimeLimitExceeded

from app import names
from app.handlers import HANDLERS, Kind
from app.usecases import intake
from tasks import base
from tasks.registered import TASKS

REQUESTS = sorted(name for name, handler in HANDLERS.items() if handler.kind is Kind.REQUEST)


@pytest.fixture
def rt(world):
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


def test_an_abort_whose_statement_hangs_past_the_soft_limit_is_kept(rt):
    """tasks/README.md: a caller's request is "carried out, or refused and recorded ...
    whatever the dispatcher's database does meanwhile". A database that accepts the
    statement and never answers (a failover whose old primary vanished without a reset:
    the socket waits for TCP's retransmission timeout, ~15 min; a row lock held by a
    frozen worker's open transaction, a migration's table lock; the pool's pre-ping hangs
    the same way, and CONNECT_TIMEOUT_S bounds only a new connection) holds the abort until
    Celery's soft limit (PIPELINE_SOFT_LIMIT_S, 300 s) raises SoftTimeLimitExceeded in it.
    `on_error` classifies that as no database error: FAILED, raised, and the late ack
    (acks_on_failure) drops the message: the abort is lost and the run goes on."""
    job_id = rt.enqueue("flip-1", net="net-a")
    rt.run_pipeline(job_id)
    task = TASKS[names.ABORT_JOB]
    hung = SoftTimeLimitExceeded("soft time limit (300) exceeded")
    with (
        mock.patch.object(intake, "request_abort", side_effect=hung),
        mock.patch.object(task, "retry", side_effect=Retry()) as retry,
        pytest.raises(Retry),
    ):
        task.run(payload={"job_id": str(job_id), "reason": "user"})
    assert retry.call_args.kwargs["max_retries"] is None  # kept until the database answers


def test_a_step_or_a_loop_killed_at_the_hard_time_limit_is_still_acknowledged():
    """A chain step's lease, or beat's next tick, does its work again: no redelivery loop."""
    kept = {name for name, task in TASKS.items() if task.acks_on_timeout is False}
    assert kept == set(REQUESTS)


@pytest.mark.parametrize("task_name", REQUESTS)
def test_a_request_killed_at_the_hard_time_limit_goes_back_to_its_queue(task_name):
    """tasks/README.md: "A worker process that dies mid-task (OOM, hard time limit) has its
    message requeued at once (reject_on_worker_lost)". Celery (5.x, Request.on_timeout)
    handles the hard limit apart from a lost worker: with acks_late it acknowledges the
    message when `acks_on_timeout` is true, which `acks_on_failure_or_timeout = True`
    (app.handlers.ACKS) makes it for every task: the request is dropped."""
    assert TASKS[task_name].acks_on_timeout is False

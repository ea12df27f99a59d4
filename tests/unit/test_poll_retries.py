"""A readiness poll is no error: wait_ready's polls (each a Celery retry with READY_POLL_S'
countdown) leave a step's transient-error retries (RETRY_MAX) and their backoff alone.

Driven through Celery's own `Task.retry` (the copy's task id, retries and headers are
Celery's); only the publish of each copy is captured, and the next delivery carries what
Celery put in it, as a worker's request would (its retries, its custom headers).
"""

from __future__ import annotations

import uuid
from typing import Any
from unittest import mock

import pytest
from celery.exceptions import Retry
from sqlalchemy.orm.exc import StaleDataError

from app import names
from app.handlers import RETRY_BACKOFF_S
from app.usecases import dispatch
from tasks import base
from tasks.registered import TASKS

pytestmark = pytest.mark.unit

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def rt(world):
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


class Deliveries:
    """A message's deliveries to wait_ready: each one's copy, as Celery's retry sent it."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.task = TASKS[names.WAIT_READY]
        self.kwargs = kwargs
        self.task_id = str(uuid.uuid4())
        self.options: dict[str, Any] = {"retries": 0, "headers": {"traceparent": TRACE}}

    def deliver(self) -> Any:
        """One delivery of the latest copy: the task's result, or the Retry it raised."""
        sent: list[dict[str, Any]] = []

        def publish(args: Any = None, kwargs: Any = None, **options: Any) -> None:
            sent.append(options)

        self.task.push_request(
            id=self.task_id,
            called_directly=False,
            retries=self.options.get("retries", 0),
            headers=self.options.get("headers"),
            kwargs=self.kwargs,
        )
        try:
            with mock.patch.object(self.task, "apply_async", side_effect=publish):
                try:
                    return self.task.run(**self.kwargs)
                except Retry as retry:
                    (self.options,) = sent
                    assert self.options["task_id"] == self.task_id
                    return retry
        finally:
            self.task.pop_request()


def polled(rt: Any, polls: int) -> Deliveries:
    """A job whose net's server never shows its site: wait_ready polled `polls` times."""
    job_id = rt.enqueue("j", net="net-a", required_sites=["site-9"])
    TASKS[names.ASSIGN_NEXT_JOB].run()
    TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a")
    messages = Deliveries({"job_id": str(job_id), "net_name": "net-a", "attempt": 0})
    for _ in range(polls):
        retry = messages.deliver()
        assert isinstance(retry, Retry)
        assert messages.options["countdown"] == rt.rt.settings.ready_poll_s
    return messages


def row_changed() -> Any:
    """The next check_ready finds its row changed by another transaction (the version check)."""
    error = StaleDataError("UPDATE statement on table 'nets' expected to update 1 row(s)")
    return mock.patch.object(dispatch, "_check_ready", side_effect=error)


def test_a_transient_error_after_many_polls_is_a_first_retry_not_the_last(rt):
    """RETRY_MAX is the step's transient-error retries: a boot polled past it, then one row
    changed meanwhile, is tried again after the first retry's backoff. Counted from Celery's
    `retries` (polls included), it was judged out of retries and its job requeued at once."""
    messages = polled(rt, rt.rt.settings.retry_max + 2)
    with row_changed():
        retry = messages.deliver()
    assert isinstance(retry, Retry)
    assert 0 <= messages.options["countdown"] <= RETRY_BACKOFF_S  # the first retry's backoff
    assert messages.options["headers"]["traceparent"] == TRACE


def test_polls_between_errors_neither_reset_nor_spend_the_steps_retries(rt):
    """Error retries stay counted across the polls between them: after RETRY_MAX of them,
    the next error exhausts the step (its job requeued by on_failure), polls or not."""
    retry_max = rt.rt.settings.retry_max
    messages = polled(rt, 1)
    for n in range(retry_max):
        with row_changed():
            assert isinstance(messages.deliver(), Retry), f"error {n + 1}"
        assert isinstance(messages.deliver(), Retry)  # a poll between two errors
        assert messages.options["countdown"] == rt.rt.settings.ready_poll_s
    with row_changed(), pytest.raises(StaleDataError):
        messages.deliver()  # EXHAUSTED: raised for on_failure, which requeues the job


PROBE = """
import json
from app import names
from app.celery_app import celery
from app.errors import TransientError
from app.handlers import ERROR_RETRIES_HEADER, Handler, Kind
from tasks.base import register

# A pipeline step that polls (its again_in) and fails transiently as the script says.
plan = ["poll", "error", "poll", "poll", "error", "done"]
seen = []


def call(rt, job_id):
    return plan[len(seen) - 1]


def step(rt, job_id):
    outcome = call(rt, job_id)
    if outcome == "error":
        raise TransientError("net busy")
    return outcome


task = register(Handler("fl_dispatcher.probe_step", step, Kind.PIPELINE,
                        again_in=lambda settings, result: 0 if result == "poll" else None))
original_run = task.run


def run(**kwargs):  # what the step's delivery read, before the product's rules run
    seen.append({"retries": task.request.retries,
                 "errors": (task.request.headers or {}).get(ERROR_RETRIES_HEADER),
                 "trace": (task.request.headers or {}).get("traceparent")})
    return original_run(**kwargs)


task.run = run
task.apply_async(kwargs={"job_id": ""}, queue=names.QUEUE,
                 headers={"traceparent": "00-%s-%s-01" % ("a" * 32, "b" * 16)})
with celery.connection_for_read() as conn:
    queue = conn.SimpleQueue(names.QUEUE)
    while len(seen) < len(plan):
        message = queue.get(timeout=5)
        # Celery's own worker-side request, run in this process as a pool process runs it.
        from celery.worker.request import Request
        Request(message, app=celery, task=task, on_ack=message.ack_log_error,
                on_reject=message.reject_log_error).execute()
        assert message.acknowledged, message._state
print(json.dumps(seen))
"""


def test_a_real_celery_delivery_carries_the_error_count_across_polls(tmp_path):
    """Celery's worker-side request on real kombu messages: each copy reads the error count
    its retry wrote, polls carry it unchanged, and the caller's trace header survives both."""
    from tests.unit.celery_process import run_script

    seen = run_script(PROBE, [], tmp_path, backoff_max_s=1)
    assert [s["retries"] for s in seen] == [0, 1, 2, 3, 4, 5]  # Celery's count: polls too
    # poll, error, poll, poll, error, done: each copy reads the errors before it.
    assert [s["errors"] for s in seen] == [None, None, 1, 1, 1, 2]
    assert {s["trace"] for s in seen} == {"00-" + "a" * 32 + "-" + "b" * 16 + "-01"}

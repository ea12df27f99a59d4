"""A step's or a request's retries after an error, counted in `fl_dispatcher_error_retries`
(tasks/base.py `_apply_rules`), where any producer may set a header:

- A count too long for int() (4,301 digits) raised out of the error path itself: a request
  whose database was down was acknowledged away (Celery's failure), a step failed loudly
  instead of requeueing its job; one of 4,300 nines parsed, but its next count could not be
  serialized, so the retry's copy was refused and the request put back at once, again and
  again (no backoff). A count is now bounded (`app.handlers.HEADER_COUNT_MAX`).
- The error retry's copy carried RabbitMQ's dead-letter headers (x-death ...), which
  Celery's own retry (a readiness poll's) drops, as RabbitMQ's cycle check drops a message
  dead-lettered again while it carries them.

Driven through Celery's own worker-side `Request` on real messages of kombu's SQL transport
(the embedded broker, which serializes each message as Redis does), run as the prefork pool
runs it (its outcome to the request's callbacks), in a process of its own, as
tests/unit/test_lost_delivery.py does. Written by a reviewer of b1cf934."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm.exc import StaleDataError

from app.handlers import ERROR_RETRIES_HEADER, header_count
from tasks import base
from tests.unit.celery_process import run_script
from tests.unit.test_poll_retries import TRACE, polled, row_changed

pytestmark = pytest.mark.unit


@pytest.fixture
def rt(world: Any) -> Iterator[Any]:
    """The unit world as the tasks' process runtime."""
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


DELIVER = """
import json, os, sys, time
from app import names
from app.celery_app import celery
from app.errors import TransientError
from app.handlers import ERROR_RETRIES_HEADER, Handler, Kind
from tasks.base import register

headers, case = json.loads(sys.argv[1]), sys.argv[2]


def fails(rt, payload):
    raise TransientError("database down")


if case == "error":  # a request whose database cannot store it now: retried, no limit
    task = register(Handler("fl_dispatcher.probe_request", fails, Kind.REQUEST))
else:  # a readiness poll: Celery's own retry, the reference for the headers a copy keeps
    task = register(Handler("fl_dispatcher.probe_poll", lambda rt, payload: "poll",
                            Kind.PIPELINE, again_in=lambda settings, result: 0))


class Pool:
    # As the prefork pool runs a request: the trace, then its outcome to the callbacks
    # (Request.execute would reject a Reject(requeue=True) without requeue).
    def apply_async(self, target, args=(), accept_callback=None, callback=None, **options):
        accept_callback(os.getpid(), time.monotonic())
        callback(target(*args))


task.apply_async(kwargs={"payload": {}}, queue=names.QUEUE, headers=headers)
with celery.connection_for_read() as conn:
    message = conn.SimpleQueue(names.QUEUE).get(timeout=5)
    task.Request(message, app=celery, task=task, on_ack=message.ack_log_error,
                 on_reject=message.reject_log_error).execute_using_pool(Pool())
held = []
with celery.connection_for_read() as conn:  # what the broker holds now (a put back too)
    queue = conn.SimpleQueue(names.QUEUE)
    while queue.qsize():  # the copy and a put back are sent before the delivery returns
        back = queue.get(timeout=5)
        count = back.headers.get(ERROR_RETRIES_HEADER)
        held.append({
            "count": count if not isinstance(count, str) else "text of %d" % len(count),
            "traceparent": back.headers.get("traceparent"),
            "names": sorted(back.headers),
        })
        back.ack()
print(json.dumps(held))
"""


def delivered(headers: dict[str, Any], case: str, tmp_path: Path) -> list[dict[str, Any]]:
    """One delivery of a message with these headers: what the broker holds afterwards."""
    tmp_path.mkdir(exist_ok=True)
    broker = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    held: list[dict[str, Any]] = run_script(
        DELIVER, [json.dumps(headers), case], tmp_path, broker_url=broker, backoff_max_s=1
    )
    return held


def test_a_huge_error_count_keeps_the_request_and_its_backoff(tmp_path: Path) -> None:
    """README: a request is 'never acknowledged away while the database cannot store it',
    retried with backoff. b1cf934: 4,301 digits raised ValueError in the error path (no copy,
    the message acknowledged: gone); 4,300 nines (whose next count no transport can carry:
    `test_a_count_header_is_a_count_whose_next_one_can_be_sent`) left the message put back as
    it was, at once, for ever while the database was down."""
    digits = "1" * 4301
    held = delivered({ERROR_RETRIES_HEADER: digits, "traceparent": TRACE}, "error", tmp_path)
    assert len(held) == 1, held  # the request is still on the broker, once
    (copy,) = held
    assert isinstance(copy["count"], int), copy  # Celery's retry's copy, one more error
    assert copy["traceparent"] == TRACE


def test_an_error_retry_sends_the_headers_celerys_own_retry_sends(tmp_path: Path) -> None:
    """The error retry's copy keeps the caller's headers as a poll's (Celery's own retry)
    does, without RabbitMQ's dead-letter headers, which Celery drops from a retry's copy:
    b1cf934's copy carried x-death and x-first-death-* again."""
    death = [{"count": 1, "reason": "expired", "queue": "fl_dispatcher", "exchange": ""}]
    headers = {"x-death": death, "x-first-death-reason": "expired", "traceparent": TRACE}
    (error,) = delivered(headers, "error", tmp_path / "error")
    (poll,) = delivered(headers, "poll", tmp_path / "poll")
    assert not [name for name in poll["names"] if name.startswith("x-")]  # Celery's own
    assert error["names"] == sorted([*poll["names"], ERROR_RETRIES_HEADER])
    assert (error["count"], error["traceparent"], poll["traceparent"]) == (1, TRACE, TRACE)


@pytest.mark.parametrize(
    "value", ["1" * 4301, "9" * 4300, 10**4300 - 1], ids=["ones-4301", "nines-4300", "int-4300"]
)
def test_a_count_header_is_a_count_whose_next_one_can_be_sent(value: object) -> None:
    """Any producer may set a header: a count of any length reads as a count, never an
    error, and its next count (the copy's) is a number JSON can carry."""
    count = header_count(value)
    assert count >= header_count("9" * 18)
    json.dumps(count + 1)


def test_a_steps_huge_error_count_is_out_of_retries_not_a_loud_failure(rt: Any) -> None:
    """A wait_ready whose error count is too long for int() is out of retries: its error is
    raised for on_failure, which requeues the job. b1cf934 raised ValueError from the error
    path (Verdict FAILED: no requeue, the job left to its lease)."""
    messages = polled(rt, 1)
    messages.options["headers"] = {**messages.options["headers"], ERROR_RETRIES_HEADER: "1" * 4301}
    with row_changed(), pytest.raises(StaleDataError):
        messages.deliver()

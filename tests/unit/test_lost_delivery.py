"""A delivery lost with its worker sends its message again (tasks/base.py `SentAgainRequest`),
driven through Celery's own `Request` handlers on a real message of kombu's in-memory broker,
in a process of its own (BROKER_URL=memory://): a request killed at its hard time limit is
sent again with its losses counted (a header of its own, its retries and other headers
kept) and the retries' backoff from its second loss, acknowledged, not put back at once; a
task's own Reject(requeue=True) is put back as it was; a copy the broker refuses leaves the
message put back. A real worker whose pool process is SIGKILLed:
tests/e2e/test_lost_worker.py; the promises a reviewer tried to break:
tests/unit/test_lost_delivery_promises.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.celery_process import run_script

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

LOSE = """
import json, random, sys, time
from billiard.einfo import ExceptionInfo
from celery.exceptions import Reject
from kombu.exceptions import OperationalError
from app import names
from app.celery_app import celery
from app.handlers import LOSSES_HEADER, sent_again_in_s
from tasks.base import SentAgainRequest
from tasks.registered import TASKS

case, losses = sys.argv[1], int(sys.argv[2])
task = TASKS[names.ENQUEUE_JOB]
headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
if losses:
    headers[LOSSES_HEADER] = losses
task.apply_async(
    kwargs={"payload": {"caller_key": "k"}}, queue=names.QUEUE, retries=2, headers=headers
)
with celery.connection_for_read() as conn:
    queue = conn.SimpleQueue(names.QUEUE)
    message = queue.get(timeout=1)
    request = SentAgainRequest(
        message, app=celery, task=task,
        on_ack=message.ack_log_error, on_reject=message.reject_log_error,
    )
    random.seed(7)
    expected = sent_again_in_s(losses, 60, random.Random(7))
    if case == "hard":
        request.on_timeout(False, 360)
    elif case == "refused":
        import celery.canvas
        def refused(*args, **kwargs):
            raise OperationalError("broker down")
        celery.canvas.Signature.apply_async = refused
        request.on_timeout(False, 360)
    else:
        try:
            raise Reject("the retry's copy was refused", requeue=True)
        except Reject:
            request.on_failure(ExceptionInfo())
    now = time.time()
    back = queue.get(timeout=1)
    seen = {
        "acked": message.acknowledged,
        "same_id": back.headers["id"] == message.headers["id"],
        "retries": back.headers["retries"],
        "losses": back.headers.get(LOSSES_HEADER),
        "traceparent": back.headers.get("traceparent") == headers["traceparent"],
        "eta_in_s": (
            None if back.headers["eta"] is None
            else __import__("datetime").datetime.fromisoformat(back.headers["eta"]).timestamp()
            - now
        ),
        "expected_s": expected,
        "more": len(queue),
    }
    back.ack()
    queue.close()
print(json.dumps(seen))
"""


def lose(case: str, losses: int, tmp_path: Path) -> dict[str, Any]:
    """One delivery of an enqueue (retried twice before) whose worker was lost `losses`
    times before, lost as `case` says."""
    seen: dict[str, Any] = run_script(LOSE, [case, str(losses)], tmp_path)
    return seen


def test_a_request_killed_at_the_hard_time_limit_the_first_time_is_sent_again_at_once(tmp_path):
    seen = lose("hard", 0, tmp_path)
    assert seen["acked"] and seen["same_id"] and seen["more"] == 0 and seen["traceparent"]
    assert seen["losses"] == 1 and seen["eta_in_s"] is None  # no countdown
    assert seen["retries"] == 2  # its database retries are its own count


def test_a_request_killed_at_the_hard_time_limit_again_waits_the_retries_backoff(tmp_path):
    """A poison request (killed every time) came back at once for ever: each turn another
    pool process killed after the hard limit (360 s), with no end and no pause."""
    seen = lose("hard", 5, tmp_path)
    assert seen["acked"] and seen["same_id"] and seen["more"] == 0 and seen["traceparent"]
    assert seen["losses"] == 6 and seen["retries"] == 2
    assert seen["expected_s"] >= 10  # random.seed(7): the draw of randrange(61)
    assert abs(seen["eta_in_s"] - seen["expected_s"]) < 1.0


def test_a_tasks_own_reject_is_put_back_as_it_was(tmp_path):
    """Reject(requeue=True) is the retry whose copy the broker refused: not sent again."""
    seen = lose("reject", 2, tmp_path)
    assert seen["same_id"] and seen["more"] == 0
    assert seen["losses"] == 2 and seen["eta_in_s"] is None


def test_a_lost_delivery_whose_copy_the_broker_refuses_is_put_back(tmp_path):
    seen = lose("refused", 3, tmp_path)
    assert seen["same_id"] and seen["more"] == 0
    assert seen["losses"] == 3 and seen["eta_in_s"] is None

"""A lost delivery's copy (tasks/base.py `SentAgainRequest`) reads its losses from a header
any sender can set: a message whose `fl_dispatcher_losses` is not a number (a hand-sent
message, another producer's) must still be sent again or put back, never left held. The
main process's reject raised instead (`int()` outside the copy's `try`), before it either
sent a copy or put the message back; billiard's pool logs and swallows what a callback
raises, so the message stayed unacknowledged in the worker, holding a prefetch slot, until
its connection closed (and then came back to raise again). Driven through Celery's own
`Request` handlers on a real message of kombu's in-memory broker, in a process of its own,
as tests/unit/test_lost_delivery.py does. Written by a reviewer of 667b8e5."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.celery_process import run_script

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

LOSE = """
import json, sys
from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from app import names
from app.celery_app import celery
from app.handlers import LOSSES_HEADER
from tasks.base import SentAgainRequest
from tasks.registered import TASKS

case, value = sys.argv[1], json.loads(sys.argv[2])
task = TASKS[names.ENQUEUE_JOB]
task.apply_async(
    kwargs={"payload": {"caller_key": "k"}}, queue=names.QUEUE, headers={LOSSES_HEADER: value}
)
with celery.connection_for_read() as conn:
    queue = conn.SimpleQueue(names.QUEUE)
    message = queue.get(timeout=1)
    request = SentAgainRequest(
        message, app=celery, task=task,
        on_ack=message.ack_log_error, on_reject=message.reject_log_error,
    )
    raised = None
    try:
        if case == "hard":
            request.on_timeout(False, 360)
        else:
            try:
                raise WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL).")
            except WorkerLostError:
                request.on_failure(ExceptionInfo())
    except Exception as exc:  # billiard's pool would log this and go on
        raised = type(exc).__name__
    copies = []
    while True:
        try:
            back = queue.get(timeout=1)
        except Exception:
            break
        copies.append(back.headers["id"] == message.headers["id"])
        back.ack()
    queue.close()
print(json.dumps({"raised": raised, "settled": request.acknowledged, "copies": copies}))
"""


def lose(case: str, value: Any, tmp_path: Path) -> dict[str, Any]:
    """One enqueue carrying `value` in its losses header, lost as `case` says."""
    seen: dict[str, Any] = run_script(LOSE, [case, json.dumps(value)], tmp_path)
    return seen


@pytest.mark.parametrize(
    ("case", "value"), [("hard", "two"), ("lost", [1]), ("lost", {"n": 1}), ("hard", "2.0")]
)
def test_a_lost_delivery_with_a_losses_header_that_is_no_int_is_not_left_held(
    case: str, value: Any, tmp_path: Path
) -> None:
    """README: a request killed at its hard time limit, or whose worker dies, 'does not lose
    its message'. With a header `int()` cannot read, no copy was sent, nothing was put back,
    and the message was left unacknowledged in the worker."""
    seen = lose(case, value, tmp_path)
    assert seen["settled"], seen  # acknowledged after a copy, or put back
    assert seen["copies"] == [True], seen  # exactly one message of that task id again

"""Promises a lost delivery's copy (tasks/base.py `SentAgainRequest`) must keep, driven through
Celery's own `Request` handlers on real messages, each case in a process of its own: the
first loss is sent again at once whatever the message's earlier retries; a step's loss does
not eat its transient-error retries (RETRY_MAX); a message the broker already took back when
the consumer's connection dropped is not also sent again; and no countdown outgrows Redis's
visibility timeout. Written by a reviewer of the first version (e67f598), which counted a
loss in Celery's `retries`, copied a message its channel had given back, and left
RETRY_BACKOFF_MAX_S unbounded: each failed there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.celery_process import run_script

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

LOSE = """
import json, random, sys
from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from app import names
from app.celery_app import celery
from tasks.base import SentAgainRequest
from tasks.registered import TASKS

case, retries = sys.argv[1], int(sys.argv[2])
name = names.DISPATCH if case == "step" else names.ENQUEUE_JOB
kwargs = (
    {"job_id": "00000000-0000-0000-0000-000000000001"} if case == "step"
    else {"payload": {"caller_key": "k"}}
)
queue_name = names.queue_for(name)
task = TASKS[name]
task.apply_async(kwargs=kwargs, queue=queue_name, retries=retries)
consumer = celery.connection_for_read()
queue = consumer.SimpleQueue(queue_name)
message = queue.get(timeout=5)
request = SentAgainRequest(
    message, app=celery, task=task,
    on_ack=message.ack_log_error, on_reject=message.reject_log_error,
)
random.seed(7)
if case == "dropped":
    # The consumer's connection drops while the task runs (a broker or database restart):
    # the transport takes its unacknowledged message back, as RabbitMQ and Redis do.
    consumer.close()
if case == "hard":
    request.on_timeout(False, 360)
else:
    try:
        raise WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL).")
    except WorkerLostError:
        try:
            request.on_failure(ExceptionInfo())
        except KeyError:
            pass  # Celery's own reject on the closed channel
copies = []
with celery.connection_for_read() as conn:
    again = conn.SimpleQueue(queue_name)
    while True:
        try:
            back = again.get(timeout=1)
        except Exception:
            break
        copies.append({"retries": back.headers["retries"], "eta": back.headers["eta"]})
        back.ack()
print(json.dumps(copies))
"""


def lose(case: str, retries: int, tmp_path: Path, **env_extra: str) -> list[dict[str, Any]]:
    """One delivery tried `retries` times before, lost as `case` says: the copies queued."""
    # kombu's SQL transport (the embedded broker): it takes back what a closed channel held
    # unacknowledged, where kombu's memory transport would drop it.
    broker = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    copies: list[dict[str, Any]] = run_script(
        LOSE, [case, str(retries)], tmp_path, broker_url=broker, env_extra=env_extra
    )
    return copies


def test_a_request_lost_for_the_first_time_after_database_retries_is_sent_again_at_once(
    tmp_path: Path,
) -> None:
    """README: 'at once the first time (a deploy ... is no fault of its own)'. An enqueue
    retried three times while PostgreSQL restarted, then lost once in a deploy, waits the
    retries' backoff instead: its loss is counted from the database retries."""
    copies = lose("hard", 3, tmp_path)
    assert len(copies) == 1
    assert copies[0]["eta"] is None  # no countdown on the first loss


def test_a_pipeline_steps_loss_does_not_spend_its_transient_error_retries(
    tmp_path: Path,
) -> None:
    """RETRY_MAX is 'transient-error retries of a pipeline step before the job is requeued':
    a dispatch whose pool process was OOM-killed once gets them all, not one fewer."""
    from app.errors import TransientError
    from app.handlers import HANDLERS, Verdict, on_error
    from app.names import DISPATCH
    from app.settings import Settings

    copies = lose("step", 0, tmp_path)
    assert len(copies) == 1
    settings = Settings(_env_file=None, RETRY_MAX=1)
    # Its first transient error after the loss is its first retry, not its last one spent.
    verdict = on_error(
        HANDLERS[DISPATCH], TransientError("net busy"), copies[0]["retries"], settings
    )
    assert verdict is Verdict.RETRY


def test_a_lost_delivery_the_broker_already_took_back_is_not_also_sent_again(
    tmp_path: Path,
) -> None:
    """The consumer's connection dropped while the task ran, so the broker put the message
    back; the pool process is then lost. Celery's reject on the dead channel added nothing
    (one message); the copy sent again on the producer's connection makes it two live copies
    of one task id (a chain step's each carrying the chain on)."""
    copies = lose("dropped", 0, tmp_path)
    assert len(copies) == 1, copies


def test_retry_backoff_max_s_cannot_outgrow_the_redis_visibility_timeout() -> None:
    """README: Redis's visibility timeout is '2 h, kept above every countdown the tasks use'.
    RETRY_BACKOFF_MAX_S caps the lost delivery's countdown (and the retries'), but nothing
    bounds it: at 3 h a copy waiting its countdown is redelivered by Redis meanwhile."""
    from pydantic import ValidationError

    from app.celery_app import VISIBILITY_TIMEOUT_S
    from app.settings import Settings

    with pytest.raises(ValidationError):
        Settings(_env_file=None, RETRY_BACKOFF_MAX_S=VISIBILITY_TIMEOUT_S + 3600)

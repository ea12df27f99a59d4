"""A request sent by name in another shape than one `payload` kwarg (its fields as the
kwargs, the payload as a positional argument, more than the payload) is refused as that
request's refusals are, never failed with a TypeError and acknowledged away (tasks/README.md
"Task API for flip-api": a message in another shape): through
Celery's own code here (flip-api's `send_task` onto kombu's Redis transport over fakeredis,
then the worker's `Request.execute`, Celery's tracer, the task), and through the task for
each request. The reviewer's reproductions: test_review20_a_misshapen_requests.py."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import fakeredis
import kombu.transport.redis
import pytest
from celery import Celery
from kombu import Connection, Queue
from sqlalchemy import select

from app import names
from app.celery_app import celery
from app.handlers import HANDLERS, Kind
from app.schemas import job_id_for
from app.usecases import enqueue, intake
from models import Prewarm, PrewarmOutcome
from tasks.base import SentAgainRequest
from tasks.registered import TASKS

pytestmark = pytest.mark.unit

FIELDS = {"caller_key": "flat-1", "definition": "tiny-job", "net": "net-a"}
REQUESTS = [name for name, handler in HANDLERS.items() if handler.kind is Kind.REQUEST]


@pytest.fixture
def rt(tasks_world):
    return tasks_world


@pytest.fixture
def broker_url(monkeypatch) -> str:
    """A redis:// URL whose connections kombu opens on an in-process fakeredis server."""
    monkeypatch.setattr(
        kombu.transport.redis.Channel, "connection_class", fakeredis.FakeRedisConnection
    )
    return f"redis://fake-broker-{uuid.uuid4().hex[:12]}:6379/0"


def worker_runs(broker_url: str, name: str, **send: Any) -> tuple[str, Any, bool]:
    """flip-api sends `name` by name with `send` (Celery's send_task); a worker's Request
    takes the message and executes it. Its task id, its result, whether it was acked."""
    flip_api = Celery("flip_api", broker=broker_url)
    try:
        task_id = flip_api.send_task(name, queue=names.QUEUE, **send).id
    finally:
        flip_api.close()
    with Connection(broker_url) as conn:
        message = Queue(names.QUEUE, channel=conn.default_channel).get(accept=["json"])
        request = SentAgainRequest(
            message,
            app=celery,
            task=celery.tasks[name],
            on_ack=message.ack_log_error,
            on_reject=message.reject_log_error,
        )
        result = request.execute()
        return task_id, result, message.acknowledged


def rejection(world: Any, key: str) -> Any:
    with world.rt.sessions() as session:
        return enqueue.get_rejection(session, job_id_for(key))


@pytest.mark.parametrize(
    "send",
    [{"kwargs": FIELDS}, {"args": [FIELDS]}, {"args": [FIELDS, 1], "kwargs": {"payload": FIELDS}}],
    ids=["fields-as-kwargs", "payload-positional", "extra-positional"],
)
def test_a_misshapen_enqueue_sent_to_a_worker_is_a_recorded_refusal_of_its_message(
    rt, broker_url, send
):
    task_id, result, acked = worker_runs(broker_url, names.ENQUEUE_JOB, **send)
    assert isinstance(result, dict), result  # not Celery's ExceptionInfo of a TypeError
    assert result["rejected"].startswith("send one `payload` kwarg: the message came with")
    assert result["caller_key"] == "flat-1" and acked
    kept = rejection(rt, "flat-1")
    assert kept is not None and kept.reason == result["rejected"]
    # Recorded with its message id: a copy of it is answered with this refusal.
    assert intake.refusal_of_message(rt.rt, task_id) == (kept.reason, "rejected")
    assert rt.job(job_id_for("flat-1")) is None  # no job


def test_the_same_fields_sent_rightly_after_a_misshapen_send_create_the_job(rt, broker_url):
    worker_runs(broker_url, names.ENQUEUE_JOB, kwargs=FIELDS)
    _, result, _ = worker_runs(broker_url, names.ENQUEUE_JOB, kwargs={"payload": FIELDS})
    assert result["created"] is True and result["job_id"] == str(job_id_for("flat-1"))


@pytest.mark.parametrize("name", REQUESTS)
def test_celerys_own_argument_check_lets_every_request_shape_through_to_its_refusal(name):
    """`Task.typing` (True here) checks apply_async's arguments against the task's run
    signature before sending: it must not raise where the worker would refuse and record."""
    check = TASKS[name].__header__
    check(FIELDS)
    check(**FIELDS)
    check(FIELDS, payload=FIELDS)


@pytest.mark.parametrize(
    "name",
    [names.ABORT_JOB, names.REPORT_JOB_STATUS, names.CANCEL_PREWARM],
)
def test_a_misshapen_abort_report_or_cancel_is_one_warning_line_not_a_traceback(
    rt, broker_url, caplog, name
):
    fields = {"job_id": str(job_id_for("flat-1")), "status": "error", "caller_key": "flat-1"}
    with caplog.at_level(logging.INFO):
        _, result, acked = worker_runs(broker_url, name, kwargs=fields)
    words = result["rejected"] if isinstance(result, dict) else result
    assert isinstance(words, str) and "send one `payload` kwarg" in words, result
    assert acked
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "send one `payload` kwarg" in warned[0].getMessage()


def prewarm_refusal(world: Any, key: str) -> Prewarm | None:
    with world.rt.sessions() as session:
        return session.scalar(select(Prewarm).where(Prewarm.caller_key == key, Prewarm.refused))


def test_a_misshapen_prewarm_is_a_recorded_refusal_under_its_key(rt, broker_url):
    fields = {"caller_key": "warm-1", "net": "net-a", "within_s": 60}
    _, result, acked = worker_runs(broker_url, names.PREWARM, args=[fields])
    assert result["refused"].startswith("send one `payload` kwarg") and acked
    assert result["caller_key"] == "warm-1"
    kept = prewarm_refusal(rt, "warm-1")
    assert kept is not None and kept.outcome == PrewarmOutcome.REJECTED
    assert rt.net("net-a").state == "STOPPED"  # it started nothing


def test_a_prewarm_whose_caller_key_is_a_json_number_is_refused_under_that_key(rt):
    answer = TASKS[names.PREWARM].run(payload={"caller_key": 42, "net": "net-a", "within_s": 9})
    assert answer["caller_key"] == "42" and "refused" in answer
    assert prewarm_refusal(rt, "42") is not None


@pytest.mark.parametrize("key", [True, 4.2, 10**5000], ids=["bool", "float", "huge"])
def test_a_key_that_is_a_bool_a_float_or_past_str_is_no_key(key):
    assert intake.caller_key_of({"caller_key": key}) is None


def test_a_shape_names_at_most_eight_kwargs_each_cut():
    sent = {f"{'k' * 60}{n}": n for n in range(12)}
    reason = intake.request_payload((), sent).reason
    assert reason.count("'k") == 8 and reason.endswith(", ...") and len(reason) < 500


# The review's reproductions (review 20): each failed with a TypeError, or recorded no key.
def _refusal_of_flat_1(world: Any) -> Any:
    with world.rt.sessions() as session:
        return enqueue.get_rejection(session, job_id_for(FIELDS["caller_key"]))


def test_an_enqueue_sent_with_its_fields_as_the_kwargs_is_a_recorded_refusal_of_flat_1(rt):
    answer = TASKS[names.ENQUEUE_JOB].run(**FIELDS)
    assert "rejected" in answer and _refusal_of_flat_1(rt) is not None


def test_an_enqueue_sent_with_its_payload_as_a_positional_argument_is_a_recorded_refusal_of_flat_1(
    rt,
):
    answer = TASKS[names.ENQUEUE_JOB].run(FIELDS)
    assert "rejected" in answer and _refusal_of_flat_1(rt) is not None


def test_an_enqueue_whose_caller_key_is_a_json_number_is_refused_under_that_key(rt):
    """A by-name caller whose run ids are numbers sends `"caller_key": 42`. The model refuses
    it (a string is required), but `caller_key_of` drops a key that is no string, so the
    refusal is recorded with no key and no job id, and the `rejected` event carries
    `caller_key: null, job_id: null`: flip-api cannot tie it to its request, and
    GET /jobs/{uuid5(ns, "42")} answers "not found" for good."""
    answer = TASKS[names.ENQUEUE_JOB].run(payload={**FIELDS, "caller_key": 42})
    assert "rejected" in answer
    assert answer["caller_key"] == "42", answer
    with rt.rt.sessions() as session:
        assert enqueue.get_rejection(session, job_id_for("42")) is not None

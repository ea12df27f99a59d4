"""What flip-api's side puts on a Redis broker, without a Redis server.

fakeredis stands in for the server underneath kombu's real Redis transport (the one
`redis://` selects in production), so these tests see the actual list the message lands in,
its envelope and serializer, and then hand the decoded message to the worker's task as a
worker would. The e2e tier does the same through a real Redis and worker, in minutes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import fakeredis
import kombu.transport.redis
import pytest
from celery import Celery
from kombu import Connection, Queue
from kombu.message import Message

import tasks.registered  # noqa: F401  registers the tasks by name, as the worker's include does
from app import names
from app.celery_app import celery, celery_config
from app.client import DispatcherClient
from app.schemas import EnqueueJob, ReportedStatus, job_id_for
from models import JobState
from tasks import base


@pytest.fixture
def broker_url(monkeypatch) -> str:
    """A redis:// URL whose connections kombu opens on an in-process fakeredis server (one
    per test: the host name is the server's key, and resolves nowhere)."""
    monkeypatch.setattr(
        kombu.transport.redis.Channel, "connection_class", fakeredis.FakeRedisConnection
    )
    return f"redis://fake-broker-{uuid.uuid4().hex[:12]}:6379/0"


@pytest.fixture
def client(broker_url) -> Iterator[DispatcherClient]:
    client = DispatcherClient(broker_url)
    yield client
    client.close()


@pytest.fixture
def rt(world):
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


def drain(broker_url: str, queue: str = names.QUEUE) -> list[Message]:
    """Every message waiting in `queue`, oldest first, decoded only if it is JSON (what the
    worker accepts)."""
    messages = []
    with Connection(broker_url) as conn:
        bound = Queue(queue, channel=conn.default_channel)
        while (message := bound.get(no_ack=True, accept=["json"])) is not None:
            messages.append(message)
    return messages


def task_call(message: Message) -> tuple[str, list, dict]:
    args, kwargs, _embed = message.decode()  # Celery message protocol 2
    return message.headers["task"], args, kwargs


def run_as_worker(message: Message) -> object:
    """What a worker does with the message: look the task up by name, call it."""
    name, args, kwargs = task_call(message)
    return celery.tasks[name].run(*args, **kwargs)


def test_the_client_sends_each_public_task_by_name_as_json_on_the_dispatcher_queue(
    client, broker_url
):
    request = EnqueueJob(caller_key="flip-7", definition="tiny-job", net="net-a", priority=5)
    job_id = client.enqueue_job(request)
    client.abort_job(job_id, reason="changed my mind")
    client.report_job_status(job_id, ReportedStatus.ERROR, detail="upload failed")

    # kombu's Redis transport: one list per queue, named as the queue.
    inspector = fakeredis.FakeRedis.from_url(broker_url)
    assert inspector.llen(names.QUEUE) == 3

    messages = drain(broker_url)
    assert [m.delivery_info["routing_key"] for m in messages] == [names.QUEUE] * 3
    assert {m.content_type for m in messages} == {"application/json"}
    assert [task_call(m) for m in messages] == [
        # (a job naming no prewarm nor project is sent without prewarm_key and project_id:
        # older workers take it)
        (
            names.ENQUEUE_JOB,
            [],
            {"payload": request.model_dump(mode="json", exclude={"prewarm_key", "project_id"})},
        ),
        (names.ABORT_JOB, [], {"payload": {"job_id": str(job_id), "reason": "changed my mind"}}),
        (
            names.REPORT_JOB_STATUS,
            [],
            {"payload": {"job_id": str(job_id), "status": "error", "detail": "upload failed"}},
        ),
    ]
    assert inspector.llen(names.QUEUE) == 0


def test_the_client_sends_a_jobs_project_id_when_it_is_set(client, broker_url):
    request = EnqueueJob(caller_key="flip-7p", definition="tiny-job", project_id="p-7")
    client.enqueue_job(request)
    [message] = drain(broker_url)
    payload = task_call(message)[2]["payload"]
    assert payload["project_id"] == "p-7" and "prewarm_key" not in payload


def test_the_worker_consumes_the_queue_the_client_sends_to(settings):
    assert celery_config(settings)["task_default_queue"] == names.QUEUE


def test_client_messages_run_on_the_worker_tasks_and_name_the_job_they_create(
    rt, client, broker_url
):
    job_id = client.enqueue_job(EnqueueJob(caller_key="flip-8", definition="tiny-job", net="net-a"))
    [enqueued] = drain(broker_url)
    result = run_as_worker(enqueued)

    assert result == {"job_id": str(job_id), "created": True, "state": "QUEUED"}
    assert rt.job(job_id).state == JobState.QUEUED

    client.abort_job(job_id)
    [abort] = drain(broker_url)
    assert run_as_worker(abort) == "ABORTED"
    assert rt.job(job_id).state == JobState.ABORTED


def test_a_plain_send_task_by_name_is_the_same_message(rt, client, broker_url):
    """flip-api need not import this package: Celery's own send_task, as the README says."""
    payload = {"caller_key": "flip-9", "definition": "tiny-job", "net": "net-a"}
    flip_api = Celery("flip_api", broker=broker_url)
    try:
        flip_api.send_task(names.ENQUEUE_JOB, kwargs={"payload": payload}, queue=names.QUEUE)
    finally:
        flip_api.close()
    client.enqueue_job(EnqueueJob(**payload))

    plain, typed = drain(broker_url)
    assert plain.delivery_info == typed.delivery_info
    assert plain.content_type == typed.content_type == "application/json"
    assert task_call(plain)[0] == task_call(typed)[0] == names.ENQUEUE_JOB

    first, repeat = run_as_worker(plain), run_as_worker(typed)
    assert first["created"] is True and repeat["created"] is False
    assert first["job_id"] == repeat["job_id"] == str(job_id_for("flip-9"))


def test_send_task_without_the_queue_lands_where_no_worker_listens(broker_url):
    flip_api = Celery("flip_api", broker=broker_url)
    try:
        flip_api.send_task(names.ENQUEUE_JOB, kwargs={"payload": {}})
    finally:
        flip_api.close()
    assert drain(broker_url) == []
    [stray] = drain(broker_url, "celery")
    assert task_call(stray)[0] == names.ENQUEUE_JOB

"""Tasks as functions: thin bodies, classified retries, requeue when retries run out.

The retry is a mock that raises Celery's Retry, as a worker would; nothing runs eagerly.
"""

from __future__ import annotations

import uuid
from unittest import mock

import pytest
from celery.exceptions import Reject, Retry
from fastapi.testclient import TestClient
from sqlalchemy.orm.exc import StaleDataError

from app import names
from app.celery_app import celery, celery_config
from app.entrypoints.api import create_app
from app.errors import DriverTransientError, ServerUnavailable
from app.handlers import HANDLERS, Kind
from app.schemas import PUBLIC_PAYLOADS, job_id_for
from app.usecases import enqueue, intake
from models import Job, JobState
from tasks import base
from tasks.registered import TASKS
from tests.fixtures.db import net_decl
from tests.unit.conftest import database_unreachable, world_of


@pytest.fixture
def rt(world):
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


API_KEY = "tasks-doors-key-0123"
AUTH = {"X-API-Key": API_KEY}


@pytest.fixture
def doors(tmp_path, job_root, sqlite_factory, clock):
    """The task door and the HTTP door (API_SECRET set) on one world."""
    nets = [net_decl(tmp_path, "net-a", "ecs")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock, API_SECRET=API_KEY)
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


def test_every_task_has_an_explicit_dotted_name_and_late_ack():
    names = {n for n in celery.tasks if n.startswith("fl_dispatcher.")}
    assert names >= {
        "fl_dispatcher.enqueue_job",
        "fl_dispatcher.abort_job",
        "fl_dispatcher.report_job_status",
        "fl_dispatcher.assign_next_job",
        "fl_dispatcher.scale_up",
        "fl_dispatcher.wait_ready",
        "fl_dispatcher.dispatch",
        "fl_dispatcher.abort_on_server",
        "fl_dispatcher.scale_down_idle_nets",
        "fl_dispatcher.keep_alive_busy_nets",
        "fl_dispatcher.monitor_running_jobs",
        "fl_dispatcher.reconcile",
    }
    for name in names:
        task = celery.tasks[name]
        assert task.acks_late and task.reject_on_worker_lost and task.ignore_result, name


def test_celery_config_is_derived_from_settings(world):
    config = celery_config(world.rt.settings)
    assert config["task_serializer"] == "json" and config["accept_content"] == ["json"]
    assert config["worker_prefetch_multiplier"] == 1
    # the prefork pool whose shared locks die with their holder (tests/unit/test_worker_pool)
    assert config["worker_pool"] == "app.worker_pool:TaskPool"
    assert config["result_backend"] is None
    # the embedded SQLAlchemy broker hands these to create_engine: nothing may go there
    assert config["broker_transport_options"] == {}
    redis = celery_config(world.rt.settings.model_copy(update={"broker_url": "redis://x/0"}))
    assert redis["broker_transport_options"]["visibility_timeout"] > 3600
    # kombu's Redis transport with the channel-close fix (tests/integration/test_broker_restart)
    assert redis["broker_transport"] == "app.redis_transport:Transport"
    assert config["broker_transport"] is None  # the embedded SQLAlchemy broker: kombu's own
    tls = celery_config(world.rt.settings.model_copy(update={"broker_url": "rediss://x/0"}))
    assert tls["broker_transport"] is None  # kombu derives its TLS defaults from the scheme


def test_the_redis_transport_path_names_the_fixed_transport():
    from kombu.transport import resolve_transport

    from app.redis_transport import TRANSPORT_PATH, Channel, Transport

    assert resolve_transport(TRANSPORT_PATH) is Transport
    assert Transport.Channel is Channel


def test_enqueue_task_rejects_an_invalid_payload_writes_no_job_and_records_why(rt):
    assert (
        "caller_key" in TASKS[names.ENQUEUE_JOB].run(payload={"definition": "tiny-job"})["rejected"]
    )
    refused = TASKS[names.ENQUEUE_JOB].run(
        payload={"caller_key": "a", "definition": "tiny-job", "net": "nope"}
    )
    assert "unknown net" in refused["rejected"]
    with rt.rt.sessions() as session:
        assert session.query(Job).count() == 0
        rejection = enqueue.get_rejection(session, job_id_for("a"))
        assert rejection is not None and "unknown net" in rejection.reason


def test_a_refused_caller_key_over_200_characters_is_recorded_as_its_own_not_its_prefixs(rt):
    """A key cut to the column's 200 characters may be another job's key: the refusal must
    not go out as that job's conflict, and the id of the key sent must answer 410."""
    taken = "k" * 200
    assert TASKS[names.ENQUEUE_JOB].run(
        payload={"caller_key": taken, "definition": "tiny-job", "net": "net-a"}
    )["created"]
    sent = taken + "-retry"
    refused = TASKS[names.ENQUEUE_JOB].run(
        payload={"caller_key": sent, "definition": "tiny-job", "net": "net-a"}
    )
    assert refused["reason_code"] == "rejected", refused
    with rt.rt.sessions() as session:
        assert enqueue.get_rejection(session, job_id_for(taken)) is None
        rejection = enqueue.get_rejection(session, job_id_for(sent))
        assert rejection is not None and "caller_key" in rejection.reason
        assert rejection.caller_key != taken and len(rejection.caller_key) <= 200
    with TestClient(create_app(rt.rt)) as client:
        assert client.get(f"/jobs/by-key/{sent}").status_code == 410
        assert client.get(f"/jobs/{job_id_for(sent)}").status_code == 410
        assert client.get(f"/jobs/by-key/{taken}").json()["state"] == "QUEUED"


@pytest.mark.parametrize(
    "key", ["proj/../run-1", "proj/./run-1", "./run-1", "..", "a//b", "/a", "a/"]
)
def test_a_caller_key_an_http_client_would_rewrite_is_refused_at_both_doors(doors, key):
    """HTTP clients drop dot segments (and proxies merge slashes): GET /jobs/by-key/proj/../run-1
    reaches the job keyed run-1. Such a key could never be looked up: it is refused, saying why."""
    body = {"caller_key": key, "definition": "tiny-job", "net": "net-a"}
    refused = TASKS[names.ENQUEUE_JOB].run(payload=body)
    assert refused["reason_code"] == "rejected" and "segment" in refused["rejected"], refused
    with TestClient(create_app(doors.rt)) as client:
        answer = client.post("/jobs", json=body, headers=AUTH)
        assert answer.status_code == 422 and "segment" in answer.text, answer.text
        # Dots inside a segment are kept by every client: such keys stay valid.
        ok = client.post("/jobs", json={**body, "caller_key": "p/..x/.r..."}, headers=AUTH)
        assert ok.status_code == 201, ok.text
        assert client.get("/jobs/by-key/p/..x/.r...").json()["caller_key"] == "p/..x/.r..."
    with doors.rt.sessions() as session:
        assert session.query(Job).count() == 1


@pytest.mark.parametrize(
    ("raw_value", "reason"),
    [
        ("1" + "0" * 5000, "priority is a number of 5001 digits; at most 4300"),
        ('{"m": ' + "[" * 1000 + "]" * 1000 + "}", "metadata has a value that is nested deeper"),
        ("{" + '"a": {' * 299 + "}" * 300, "metadata nests deeper than 32 levels"),
    ],
)
def test_a_message_python_cannot_read_reaches_the_task_and_is_a_recorded_rejection(
    rt, raw_value, reason
):
    """Valid JSON that Python's decoder will not read (a number past the digit limit,
    nesting past the recursion limit), as a sender in another language may send it: kombu's
    decoder, as Celery configures it, hands the task the payload with that value marked, and
    the task refuses and records it under its key; kombu's own decoder raised and the
    worker dropped the message."""
    from kombu import serialization

    field = "priority" if "digits" in reason else "metadata"
    body = (
        '[[], {"payload": {"caller_key": "unreadable", "definition": "tiny-job", '
        f'"net": "net-a", "{field}": {raw_value}}}}}, {{"callbacks": null}}]'
    )
    _, kwargs, _ = serialization.loads(
        body.encode(), "application/json", "utf-8", accept={"application/json"}
    )
    refused = TASKS[names.ENQUEUE_JOB].run(**kwargs)
    assert reason in refused["rejected"] and refused["caller_key"] == "unreadable"
    with rt.rt.sessions() as session:
        assert session.query(Job).count() == 0
        rejection = enqueue.get_rejection(session, job_id_for("unreadable"))
        assert rejection is not None and reason in rejection.reason


def test_rejections_are_kept_for_their_retention_only(rt):
    TASKS[names.ENQUEUE_JOB].run(payload={"caller_key": "old", "definition": "nope/../x"})
    rt.clock.advance(rt.rt.settings.rejected_retention_s + 1)
    TASKS[names.ENQUEUE_JOB].run(payload={"caller_key": "new", "definition": "nope/../x"})
    with rt.rt.sessions() as session:
        assert enqueue.get_rejection(session, job_id_for("old")) is None
        assert enqueue.get_rejection(session, job_id_for("new")) is not None


def test_enqueue_task_sends_assign_after_commit(rt):
    result = TASKS[names.ENQUEUE_JOB].run(
        payload={"caller_key": "flip-1", "definition": "tiny-job", "net": "net-a"}
    )
    assert result["created"] is True
    assert rt.job(uuid.UUID(result["job_id"])).state == JobState.QUEUED
    assert rt.outbox.sent == [("fl_dispatcher.assign_next_job", {})]


def test_wait_ready_polls_with_a_short_countdown_until_ready(rt):
    job_id = rt.enqueue("j", net="net-a", required_sites=["site-9"])
    TASKS[names.ASSIGN_NEXT_JOB].run()
    TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a")
    with (
        mock.patch.object(TASKS[names.WAIT_READY], "retry", side_effect=Retry()) as retry,
        pytest.raises(Retry),
    ):
        TASKS[names.WAIT_READY].run(job_id=str(job_id), net_name="net-a")
    assert retry.call_args.kwargs["countdown"] == rt.rt.settings.ready_poll_s
    rt.server("net-a").sites.append("site-9")
    assert TASKS[names.WAIT_READY].run(job_id=str(job_id), net_name="net-a") == "done"


def test_transient_errors_autoretry_and_are_counted(rt):
    job_id = rt.enqueue("j", net="net-a")
    TASKS[names.ASSIGN_NEXT_JOB].run()
    rt.driver("net-a").fail_with = DriverTransientError("throttled")
    with (
        mock.patch.object(TASKS[names.SCALE_UP], "retry", side_effect=Retry()) as retry,
        pytest.raises(Retry),
    ):
        TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a")
    assert isinstance(retry.call_args.kwargs["exc"], DriverTransientError)
    assert rt.job(job_id).retries == 1


@pytest.mark.parametrize(
    "exc",
    [
        DriverTransientError("still throttled"),
        # A row changed meanwhile is retried like a transient error, and ends like one.
        StaleDataError("UPDATE statement on table 'jobs' expected to update 1 row(s); 0 matched"),
    ],
    ids=["transient", "row-changed"],
)
def test_retries_exhausted_requeue_the_job(rt, exc):
    """app/handlers.py: a pipeline step's error that on_error retries is retried up to
    RETRY_MAX, "then the job is requeued, never dropped"."""
    job_id = rt.enqueue("j", net="net-a")
    TASKS[names.ASSIGN_NEXT_JOB].run()
    TASKS[names.DISPATCH].on_failure(
        exc, "t", (), {"job_id": str(job_id), "net_name": "net-a", "attempt": 0}, None
    )
    job = rt.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 1)


def test_retries_exhausted_while_dispatching_keep_the_attempt_and_its_token(rt):
    # The submit may have landed with its reply lost: a new attempt with a new token could
    # start a second run, so the job stays DISPATCHING for the reconciler to settle.
    job_id = rt.enqueue("j", net="net-a")
    rt.run_pipeline(job_id)
    with rt.rt.sessions.begin() as session:
        job = session.get(Job, job_id)
        job.state = JobState.DISPATCHING
    TASKS[names.DISPATCH].on_failure(
        ServerUnavailable("no reply"),
        "t",
        (),
        {"job_id": str(job_id), "net_name": "net-a", "attempt": 0},
        None,
    )
    job = rt.job(job_id)
    assert (job.state, job.attempts, job.submit_token) == (
        JobState.DISPATCHING,
        0,
        f"{job_id}-0",
    )


def test_a_non_transient_failure_does_not_requeue(rt):
    job_id = rt.enqueue("j", net="net-a")
    TASKS[names.ASSIGN_NEXT_JOB].run()
    ids = {"job_id": str(job_id), "net_name": "net-a", "attempt": 0}
    TASKS[names.DISPATCH].on_failure(ValueError("bug"), "t", (), ids, None)
    assert rt.job(job_id).state == JobState.ASSIGNED


def test_housekeeping_tasks_call_their_use_case(rt):
    job_id = rt.enqueue("j", net="net-a")
    rt.run_pipeline(job_id)
    assert TASKS[names.KEEP_ALIVE_BUSY_NETS].run() == ["net-a"]
    assert rt.server("net-a").pings == 1
    rt.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    assert TASKS[names.MONITOR_RUNNING_JOBS].run() == {str(job_id): "completed"}
    assert rt.job(job_id).state == JobState.COMPLETED
    rt.clock.advance(61)
    assert TASKS[names.SCALE_DOWN_IDLE_NETS].run() == ["net-a"]
    rt.driver("net-a").replicas = 1  # drift: a server up while the net is STOPPED
    rt.clock.advance(rt.rt.settings.stuck_after_s + 1)
    result = TASKS[names.RECONCILE].run()
    assert any("drift" in note for note in result["repaired"])
    assert rt.driver("net-a").replicas == 0


def test_abort_task_of_a_running_job_hands_the_server_abort_to_a_worker(rt):
    # The request is answered from SQL alone; the server is told by abort_on_server, sent
    # after the commit (what a down server means there is pinned against a real server).
    job_id = rt.enqueue("j", net="net-a")
    rt.run_pipeline(job_id)
    rt.outbox.sent.clear()
    assert TASKS[names.ABORT_JOB].run(payload={"job_id": str(job_id)}) == JobState.ABORTING
    assert rt.outbox.sent == [(names.ABORT_ON_SERVER, {"job_id": str(job_id)})]


def test_a_step_that_found_its_net_misconfigured_ends_its_chain_without_raising(rt, caplog):
    # The use case handled it (net MISCONFIGURED, job back in the queue, one ERROR line);
    # raising on would have Celery log "raised unexpected" with a traceback.
    from app.errors import DriverMisconfigured
    from tests.unit.test_warm_dispatch import chain_request

    job_id = rt.enqueue("j", net="net-a")
    TASKS[names.ASSIGN_NEXT_JOB].run()
    rt.driver("net-a").fail_with = DriverMisconfigured("service fl-server-net-a missing")
    with chain_request() as request:
        assert TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a") == ("misconfigured")
        assert request.chain is None
    job = rt.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 0)
    assert "misconfigured" in (job.last_error or "")


# --- a database that cannot store a caller's request ------------------------------------------

CALLER_REQUESTS = {
    names.ENQUEUE_JOB: {"caller_key": "flip-1", "definition": "tiny-job", "net": "net-a"},
    names.ABORT_JOB: {"job_id": str(job_id_for("flip-1")), "reason": "user"},
    names.REPORT_JOB_STATUS: {"job_id": str(job_id_for("flip-1")), "status": "error"},
    names.PREWARM: {"caller_key": "hint-1", "net": "net-a", "within_s": 60},
    names.CANCEL_PREWARM: {"caller_key": "hint-1"},
}


def test_flip_api_requests_are_the_tasks_kept_while_the_database_is_down():
    requests = {name for name, h in HANDLERS.items() if h.kind is Kind.REQUEST}
    assert set(CALLER_REQUESTS) == requests
    assert set(PUBLIC_PAYLOADS) == requests  # every task flip-api sends


@pytest.mark.parametrize("task_name", sorted(CALLER_REQUESTS))
def test_a_request_the_database_cannot_store_is_retried_not_acknowledged_away(rt, task_name):
    task = celery.tasks[task_name]
    with (
        database_unreachable(rt),
        mock.patch.object(task, "retry", side_effect=Retry()) as retry,
        pytest.raises(Retry),
    ):
        task.run(payload=CALLER_REQUESTS[task_name])
    assert retry.call_args.kwargs["max_retries"] is None  # until the database is back
    assert 0 <= retry.call_args.kwargs["countdown"] <= rt.rt.settings.retry_backoff_max_s


def test_an_enqueue_retried_after_the_outage_stores_the_job(rt):
    payload = CALLER_REQUESTS[names.ENQUEUE_JOB]
    with (
        database_unreachable(rt),
        mock.patch.object(TASKS[names.ENQUEUE_JOB], "retry", side_effect=Retry()),
        pytest.raises(Retry),
    ):
        TASKS[names.ENQUEUE_JOB].run(payload=payload)
    answer = TASKS[names.ENQUEUE_JOB].run(payload=payload)  # the retry's delivery
    assert answer["created"] is True
    assert rt.job(job_id_for("flip-1")).state == JobState.QUEUED


def test_a_retry_the_broker_refuses_puts_the_message_back_instead_of_dropping_it(rt):
    refused = Reject(ConnectionError("broker down"), requeue=False)  # what Task.retry raises
    with (
        database_unreachable(rt),
        mock.patch.object(TASKS[names.ABORT_JOB], "retry", side_effect=refused),
        pytest.raises(Reject) as raised,
    ):
        TASKS[names.ABORT_JOB].run(payload=CALLER_REQUESTS[names.ABORT_JOB])
    assert raised.value.requeue is True


def test_a_request_failing_for_another_reason_is_not_retried(rt):
    with (
        mock.patch.object(intake, "report_status", side_effect=ValueError("a bug")),
        mock.patch.object(TASKS[names.REPORT_JOB_STATUS], "retry") as retry,
        pytest.raises(ValueError, match="a bug"),
    ):
        TASKS[names.REPORT_JOB_STATUS].run(payload=CALLER_REQUESTS[names.REPORT_JOB_STATUS])
    retry.assert_not_called()


def test_the_retry_log_line_names_the_error_class_not_its_text(rt, caplog):
    with (
        database_unreachable(rt),
        mock.patch.object(TASKS[names.ENQUEUE_JOB], "retry", side_effect=Retry()),
        pytest.raises(Retry),
    ):
        TASKS[names.ENQUEUE_JOB].run(payload=CALLER_REQUESTS[names.ENQUEUE_JOB])
    (line,) = [r for r in caplog.records if "request kept" in r.getMessage()]
    assert line.reason == "OperationalError" and "no/such/folder" not in str(line.__dict__)

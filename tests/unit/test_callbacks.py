"""Status callbacks: the signing scheme, and the delivery use case's ordering, retry and
give-up rules, driven by the real use cases on an embedded database with a recording
receiver in place of HTTP (tests/integration/test_callbacks_http.py does it over HTTP)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from celery.exceptions import Retry
from sqlalchemy import select, update

from app import names
from app.adapters.callbacks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Answer,
    ReceiverUnreachable,
    describe_unreachable,
    encode_body,
    sign,
    signed_headers,
    verify,
)
from app.celery_app import beat_schedule
from app.entrypoints.api import job_detail
from app.errors import SettingsError
from app.logs import secret_values
from app.metrics.exposition import families
from app.metrics.read import read_snapshot
from app.runtime import RecordingOutbox
from app.schemas import EnqueueJob, job_id_for
from app.settings import Settings
from app.usecases import (
    callback_receiver,
    callbacks,
    enqueue,
    intake,
    monitor,
    services,
)
from models import CallbackReceiver, Job, JobEvent, JobState, ReasonCode, RejectedRequest
from tests.fixtures.db import net_decl
from tests.unit.conftest import World
from tests.unit.lost_commit_reply import commit_reply_lost
from tests.unit.test_webhook_signatures import MALFORMED_CASES, malformed_webhook_requests

SECRET = "a-callback-secret-of-some-length"
README = Path(__file__).resolve().parents[2] / "README.md"


class Receiver:
    """flip-api as the sender sees it: answers by a rule, or does not answer while down."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, Any], dict[str, str], int]] = []
        self.down = False
        self.rule: Callable[[dict[str, Any]], int] = lambda payload: 200
        self.during_post: Callable[[], None] | None = None

    def post(self, body: bytes, headers) -> Answer:
        if self.during_post is not None:
            self.during_post()
        if self.down:
            raise ReceiverUnreachable("ConnectError: [Errno 111] Connection refused")
        payload = json.loads(body)
        assert verify(
            SECRET,
            headers[TIMESTAMP_HEADER],
            headers[SIGNATURE_HEADER],
            body,
            now_s=float(headers[TIMESTAMP_HEADER]),
        )
        status = self.rule(payload)
        self.requests.append((payload, dict(headers), status))
        return Answer(status, "nope" if status >= 300 else "")

    def close(self) -> None:
        pass

    def sent(self, job_id=None) -> list[tuple[int, str]]:
        """(event_id, to_state) of every request, in the order they came."""
        return [
            (p["event_id"], p.get("to_state") or p["kind"])
            for p, _, _ in self.requests
            if job_id is None or p["job_id"] == str(job_id)
        ]

    def accepted(self, job_id=None) -> list[str]:
        return [
            p.get("to_state") or p["kind"]
            for p, _, status in self.requests
            if 200 <= status < 300 and (job_id is None or p["job_id"] == str(job_id))
        ]


def callback_settings(tmp_path, job_root, **extra: Any) -> Settings:
    nets = [
        net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120),
        net_decl(tmp_path, "fixed", "static"),
    ]
    values: dict[str, Any] = {
        "FL_DISPATCHER_DATA_DIR": tmp_path / "data",
        "JOB_ROOT": job_root,
        "NETS": json.dumps(nets),
        "PER_JOB_FL_SERVER": "true",
        "CALLBACK_URL": "http://flip-api.invalid/fl/callbacks",
        "CALLBACK_SECRET": SECRET,
        "CALLBACK_MAX_BACKOFF_S": 10,
    }
    return Settings(**(values | extra))


@pytest.fixture
def cb(tmp_path, job_root, sqlite_factory, clock) -> World:
    return World(callback_settings(tmp_path, job_root), sqlite_factory, clock)


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


def deliver(world: World, receiver: Receiver) -> callbacks.DeliveryReport:
    return callbacks.deliver_callbacks(world.rt, sender=receiver)


def complete(world: World, job_id) -> None:
    """The job's whole life through the real use cases: enqueued, run, finished."""
    world.run_pipeline(job_id)
    nvflare_id = world.job(job_id).nvflare_job_id
    world.server("net-a").statuses[nvflare_id] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.COMPLETED


LIFE = ["QUEUED", "ASSIGNED", "DISPATCHING", "RUNNING", "COMPLETED"]


def receiver_row(world: World) -> CallbackReceiver:
    with world.rt.sessions() as session:
        row = session.get(CallbackReceiver, callback_receiver.RECEIVER_ID)
        assert row is not None
        return row


def status(world: World, job_id) -> dict[str, Any]:
    with world.rt.sessions() as session:
        return callbacks.delivery_status(session, job_id)


# --- signing -------------------------------------------------------------------------------


def test_the_signature_is_hmac_sha256_over_timestamp_dot_body():
    # A fixed vector: the scheme is a contract with flip-api and must not drift.
    assert sign("key", 1700000000, b'{"a":1}') == (
        "sha256=a438e398bfafc57e4396bb7fc2304422f0f768e965d073ca313cb52e22e6ad03"
    )


def test_verify_accepts_the_signed_body_and_nothing_else():
    body = encode_body({"b": 2, "a": "é"})
    assert body == '{"a":"é","b":2}'.encode()  # compact, sorted keys, UTF-8
    headers = signed_headers(SECRET, 1_000_000, body, 7)
    ts, sig = headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER]
    assert verify(SECRET, ts, sig, body, now_s=1_000_100)
    assert not verify("another-secret-entirely", ts, sig, body, now_s=1_000_100)
    assert not verify(SECRET, ts, sig, body + b" ", now_s=1_000_100)  # tampered body
    assert not verify(SECRET, "1000001", sig, body, now_s=1_000_100)  # timestamp swapped
    assert not verify(SECRET, ts, sig, body, now_s=1_000_301)  # too old: a replay
    assert not verify(SECRET, "soon", sig, body, now_s=1_000_100)
    # Malformed headers are refused, never raised on (a receiver would answer 500).
    assert not verify(SECRET, ts, "sha256=é", body, now_s=1_000_100)
    assert not verify(SECRET, "9" * 400, sig, body, now_s=1_000_100)
    assert not verify(SECRET, "\u0661" + "\u0660" * 6, sig, body, now_s=1_000_100)
    assert headers["X-FL-Dispatcher-Event-Id"] == "7"


def _readme_snippet(function: str) -> str:
    text = README.read_text()
    section = text.split("## Status callbacks", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return next(block for block in blocks if f"def {function}(" in block)


def test_the_readme_standard_webhooks_snippet_accepts_a_real_request_and_refuses_forgeries():
    from standardwebhooks.webhooks import WebhookVerificationError

    namespace: dict[str, Any] = {}
    exec(_readme_snippet("verify_event"), namespace)
    verify_event = namespace["verify_event"]
    body = encode_body({"event_id": 1, "to_state": "RUNNING"})
    headers = signed_headers(SECRET, int(time.time()), body, 1)
    assert verify_event(SECRET, headers, body) == {"event_id": 1, "to_state": "RUNNING"}
    for forged in (
        (SECRET, {**headers, "webhook-id": "2"}, body),  # the id is signed
        ("wrong-secret-wrong-secret", headers, body),
        (SECRET, headers, body.replace(b"RUNNING", b"FAILED")),
        (SECRET, signed_headers(SECRET, int(time.time()) - 3600, body, 1), body),
    ):
        with pytest.raises(WebhookVerificationError):
            verify_event(*forged)


@pytest.mark.parametrize("case", MALFORMED_CASES)
def test_the_readme_standard_webhooks_snippet_refuses_every_malformed_header(case):
    # A receiver answers 401 on WebhookVerificationError: anything else it raises is a 500.
    from standardwebhooks.webhooks import WebhookVerificationError

    namespace: dict[str, Any] = {}
    exec(_readme_snippet("verify_event"), namespace)
    headers, body = malformed_webhook_requests(SECRET)[case]
    with pytest.raises(WebhookVerificationError):
        namespace["verify_event"](SECRET, headers, body)


def test_the_readme_verification_snippet_accepts_a_real_request_and_refuses_forgeries():
    code = _readme_snippet("verify_callback")
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    verify_callback = namespace["verify_callback"]
    body = encode_body({"event_id": 1, "to_state": "RUNNING"})
    headers = signed_headers(SECRET, int(time.time()), body, 1)
    assert verify_callback(SECRET.encode(), headers, body)
    assert not verify_callback(b"wrong-secret-wrong-secret", headers, body)
    assert not verify_callback(SECRET.encode(), headers, body.replace(b"RUNNING", b"FAILED"))
    stale = signed_headers(SECRET, int(time.time()) - 3600, body, 1)
    assert not verify_callback(SECRET.encode(), stale, body)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (TIMESTAMP_HEADER, None),
        (SIGNATURE_HEADER, None),
        (SIGNATURE_HEADER, "sha256=é"),
        (SIGNATURE_HEADER, ""),
        (TIMESTAMP_HEADER, "\u0661\u0667" + "\u0660" * 8),
        (TIMESTAMP_HEADER, "9" * 400),
        (TIMESTAMP_HEADER, "-5"),
        (TIMESTAMP_HEADER, "17²"),
    ],
    ids=[
        "no-timestamp",
        "no-signature",
        "non-ascii-signature",
        "empty-signature",
        "non-ascii-digits",
        "timestamp-of-400-digits",
        "negative-timestamp",
        "superscript-digit",
    ],
)
def test_the_readme_verification_snippet_refuses_every_malformed_header(name, value):
    # False, never an exception: a receiver that copies it must not answer 500.
    namespace: dict[str, Any] = {}
    exec(_readme_snippet("verify_callback"), namespace)
    body = encode_body({"event_id": 1, "to_state": "RUNNING"})
    headers = signed_headers(SECRET, int(time.time()), body, 1)
    broken = {k: v for k, v in headers.items() if k != name}
    if value is not None:
        broken[name] = value
    assert namespace["verify_callback"](SECRET.encode(), broken, body) is False


def test_an_unreachable_receiver_is_described_without_url_credentials():
    url = "https://user:hunter2@flip-api.example/cb"
    text = describe_unreachable(OSError(f"cannot reach {url}"), url)
    assert "hunter2" not in text and "flip-api.example" in text


# --- settings ------------------------------------------------------------------------------


def test_callbacks_need_a_secret_and_an_http_url(tmp_path, job_root):
    with pytest.raises(SettingsError, match="CALLBACK_SECRET"):
        callback_settings(tmp_path, job_root, CALLBACK_SECRET="")
    with pytest.raises(SettingsError, match="CALLBACK_SECRET"):
        callback_settings(tmp_path, job_root, CALLBACK_SECRET="short")
    with pytest.raises(SettingsError, match="CALLBACK_URL"):
        callback_settings(tmp_path, job_root, CALLBACK_URL="ftp://flip-api/cb")
    off = callback_settings(tmp_path, job_root, CALLBACK_URL="  ", CALLBACK_SECRET="")
    assert not off.callbacks_enabled


def test_the_secret_and_url_password_are_masked(tmp_path, job_root):
    settings = callback_settings(
        tmp_path, job_root, CALLBACK_URL="https://flip:pw-in-url@flip-api/cb"
    )
    shown = json.dumps(settings.redacted())
    assert SECRET not in shown and "pw-in-url" not in shown
    assert {SECRET, "pw-in-url"} <= set(secret_values(settings))


def test_beat_sweeps_callbacks_only_when_they_are_on(cb, settings):
    assert beat_schedule(cb.rt.settings)["deliver-callbacks"]["task"] == names.DELIVER_CALLBACKS
    assert "deliver-callbacks" not in beat_schedule(settings)


# --- delivery ------------------------------------------------------------------------------


def test_a_jobs_life_is_delivered_in_order_signed_and_only_once(cb, receiver):
    job_id = cb.enqueue("j1", net="net-a", metadata={"model_id": "m-42", "project_id": "p-7"})
    complete(cb, job_id)

    report = deliver(cb, receiver)
    assert (report.delivered, report.failed, report.retry_in_s) == (5, 0, None)
    assert [state for _, state in receiver.sent()] == LIFE
    ids = [event_id for event_id, _ in receiver.sent()]
    assert ids == sorted(ids) and len(set(ids)) == 5
    first, *_, running, done = [p for p, _, _ in receiver.requests]
    assert first == {
        "event_id": ids[0],
        "kind": "state_change",
        "job_id": str(job_id),
        "caller_key": "j1",
        "metadata": {"model_id": "m-42", "project_id": "p-7"},
        "from_state": None,
        "to_state": "QUEUED",
        "at": cb.job(job_id).created_at.isoformat(),
        "reason": "enqueued",
        "reason_code": None,
        "nvflare_job_id": None,
        "attempt": 1,
    }
    assert (running["nvflare_job_id"], running["attempt"]) == ("nv-1", 1)
    assert running["metadata"] == first["metadata"]
    assert (done["from_state"], done["nvflare_job_id"]) == ("RUNNING", "nv-1")
    assert done["reason_code"] == "run_completed"

    assert deliver(cb, receiver).delivered == 0  # nothing is sent twice
    assert len(receiver.requests) == 5
    assert status(cb, job_id) == {
        "delivered": 5,
        "pending": 0,
        "failed": 0,
        "last_error": None,
        "next_attempt_at": None,
    }


def test_a_late_callback_tells_its_own_move_not_the_jobs_later_state(cb, receiver):
    """The receiver is down while the job runs and is requeued: the RUNNING event delivered
    afterwards still names the run and attempt it was about."""
    job_id = cb.enqueue("j1", net="net-a")
    cb.run_pipeline(job_id)
    cb.server("net-a").restart(2000.0)  # the server restarted under the job
    monitor.monitor_running_jobs(cb.rt)
    job = cb.job(job_id)
    assert (job.state, job.attempts, job.nvflare_job_id) == (JobState.QUEUED, 1, None)

    deliver(cb, receiver)
    by_state = {p["to_state"]: p for p, _, _ in receiver.requests}
    assert (by_state["RUNNING"]["nvflare_job_id"], by_state["RUNNING"]["attempt"]) == ("nv-1", 1)
    requeued = [p for p, _, _ in receiver.requests if p["from_state"] == "RUNNING"]
    assert [(p["to_state"], p["attempt"], p["nvflare_job_id"]) for p in requeued] == [
        ("QUEUED", 2, None)
    ]


def test_a_job_held_back_by_its_receiver_answer_keeps_its_order_and_holds_back_no_other(
    cb, receiver
):
    a = cb.enqueue("a", net="net-a")
    cb.run_pipeline(a)
    b = cb.enqueue("b", net="fixed")
    cb.run_pipeline(b)
    with cb.rt.sessions() as session:
        a_assigned = session.scalar(
            select(JobEvent.id).where(JobEvent.job_id == a, JobEvent.to_state == JobState.ASSIGNED)
        )
    receiver.rule = lambda p: 503 if p["event_id"] == a_assigned else 200

    report = deliver(cb, receiver)
    assert receiver.accepted(b) == ["QUEUED", "ASSIGNED", "DISPATCHING", "RUNNING"]
    assert receiver.sent(a) == [(receiver.sent(a)[0][0], "QUEUED"), (a_assigned, "ASSIGNED")]
    assert status(cb, a)["pending"] == 3
    assert status(cb, a)["last_error"] == f"event {a_assigned}: HTTP 503: nope"
    assert report.retry_in_s == 2.0  # the one wake-up, when job a's backoff ends

    cb.clock.advance(1)
    deliver(cb, receiver)
    assert len(receiver.sent(a)) == 2  # not before its backoff

    receiver.rule = lambda p: 200
    cb.clock.advance(1)
    deliver(cb, receiver)
    assert receiver.accepted(a) == ["QUEUED", "ASSIGNED", "DISPATCHING", "RUNNING"]
    sent_a = [state for _, state in receiver.sent(a)]
    assert sent_a == ["QUEUED", "ASSIGNED", "ASSIGNED", "DISPATCHING", "RUNNING"]


def test_a_silent_receiver_rests_all_delivery_with_a_capped_backoff(cb, receiver):
    first = cb.enqueue("j1", net="net-a")
    second = cb.enqueue("j2", net="fixed")
    receiver.down = True
    tries = []
    waits = []
    for _ in range(6):
        before = receiver_row_failures(cb)
        report = deliver(cb, receiver)
        row = receiver_row(cb)
        tries.append(row.failures - before)
        waits.append((row.next_attempt_at - cb.clock()).total_seconds())
        assert report.retry_in_s == waits[-1]
        cb.clock.advance(1)
        assert deliver(cb, receiver).retry_in_s is None  # resting; the wake-up is scheduled
        assert receiver_row(cb).failures == row.failures  # and nothing was tried
        cb.clock.advance(waits[-1])
    # two tries per rest (the oldest event, then one other: a receiver that answers the
    # other is not down, only the first job waits); 4 s, then CALLBACK_MAX_BACKOFF_S
    assert tries == [2] * 6
    assert waits == [4.0, 10.0, 10.0, 10.0, 10.0, 10.0]
    assert receiver.requests == []

    receiver.down = False
    deliver(cb, receiver)
    assert receiver.accepted(first) == ["QUEUED"] and receiver.accepted(second) == ["QUEUED"]
    assert receiver_row(cb).failures == 0
    assert status(cb, first)["last_error"] == (
        f"event {receiver.sent(first)[0][0]}: ConnectError: [Errno 111] Connection refused"
    )


def receiver_row_failures(world: World) -> int:
    with world.rt.sessions() as session:
        row = session.get(CallbackReceiver, callback_receiver.RECEIVER_ID)
        return row.failures if row is not None else 0


def test_a_rejected_event_is_given_up_after_the_4xx_limit_and_the_job_moves_on(cb, receiver):
    job_id = cb.enqueue("j1", net="net-a")
    complete(cb, job_id)
    receiver.rule = lambda p: 422 if p["to_state"] == "ASSIGNED" else 200

    for _ in range(10):
        deliver(cb, receiver)
        cb.clock.advance(10)
    assert [state for _, state in receiver.sent()] == [
        "QUEUED",
        "ASSIGNED",
        "ASSIGNED",
        "ASSIGNED",  # CALLBACK_MAX_4XX_TRIES = 3, then never again
        "DISPATCHING",
        "RUNNING",
        "COMPLETED",
    ]
    got = status(cb, job_id)
    assert (got["delivered"], got["failed"], got["pending"]) == (4, 1, 0)
    assert got["last_error"].endswith(
        "HTTP 422: nope (rejected 3 times: given up, the job's next event goes out)"
    )
    with cb.rt.sessions() as session:
        backlog = callbacks.backlog(session)
    assert (backlog.undelivered, backlog.failed) == (0, 1)


@pytest.mark.parametrize("answer", [408, 429, 500, 503])
def test_a_failing_or_busy_receiver_is_retried_past_the_4xx_limit(cb, receiver, answer):
    job_id = cb.enqueue("j1", net="net-a")
    receiver.rule = lambda p: answer
    for _ in range(6):
        deliver(cb, receiver)
        cb.clock.advance(10)
    assert len(receiver.requests) == 6
    assert status(cb, job_id)["failed"] == 0 and status(cb, job_id)["pending"] == 1
    receiver.rule = lambda p: 200
    deliver(cb, receiver)
    assert receiver.accepted(job_id) == ["QUEUED"]


def test_a_second_deliverer_waits_for_the_lease_and_takes_it_over_when_it_expires(cb, receiver):
    job_id = cb.enqueue("j1", net="net-a")
    assert callback_receiver.claim_lease(cb.rt, "a-worker-that-died")
    report = deliver(cb, receiver)
    assert report.busy and receiver.requests == []

    cb.clock.advance(callback_receiver._lease_s(cb.rt) + 1)
    assert deliver(cb, receiver).delivered == 1
    assert receiver.accepted(job_id) == ["QUEUED"]


def test_a_deliverer_that_lost_its_lease_records_nothing_and_the_event_goes_again(cb, receiver):
    job_id = cb.enqueue("j1", net="net-a")

    def taken_over() -> None:
        with cb.rt.sessions.begin() as session:
            session.execute(update(CallbackReceiver).values(lease_owner="someone-else"))

    receiver.during_post = taken_over
    assert deliver(cb, receiver).delivered == 0
    assert status(cb, job_id)["pending"] == 1  # the answer was not recorded

    receiver.during_post = None
    cb.clock.advance(callback_receiver._lease_s(cb.rt) + 1)
    deliver(cb, receiver)
    (first, _), (again, _) = receiver.sent()
    assert first == again  # a duplicate carries the same event_id
    assert status(cb, job_id)["delivered"] == 1


def test_events_committed_while_the_lease_is_held_go_out_in_the_same_call(cb, receiver):
    """A kick that found the lease held returns at once; the holder looks again after
    letting go, so the event does not wait for the sweep."""
    first = cb.enqueue("j1", net="net-a")
    late: list[Any] = []

    def a_commit_meanwhile() -> None:
        receiver.during_post = None
        late.append(cb.enqueue("j2", net="fixed"))
        assert deliver(cb, receiver).busy  # the kick for it finds the lease held

    receiver.during_post = a_commit_meanwhile
    report = deliver(cb, receiver)
    assert report.delivered == 2 and report.retry_in_s is None
    assert receiver.accepted(first) == ["QUEUED"] and receiver.accepted(late[0]) == ["QUEUED"]


def test_only_one_retry_of_the_task_is_ever_scheduled(cb, receiver):
    cb.enqueue("j1", net="net-a")
    receiver.down = True
    assert deliver(cb, receiver).retry_in_s == 2.0
    cb.enqueue("j2", net="fixed")  # its kick finds work waiting, but a wake-up is due
    assert deliver(cb, receiver).retry_in_s is None
    cb.clock.advance(2)  # the scheduled retry runs, fails again (both jobs' events: the
    # second is tried before the receiver is taken for down), schedules the next one
    assert deliver(cb, receiver).retry_in_s == 8.0
    assert deliver(cb, receiver).retry_in_s is None


def test_callbacks_off_sends_nothing(tmp_path, job_root, sqlite_factory, clock, receiver):
    world = World(
        callback_settings(tmp_path, job_root, CALLBACK_URL="", CALLBACK_SECRET=""),
        sqlite_factory,
        clock,
    )
    world.enqueue("j1", net="net-a")
    assert deliver(world, receiver) == callbacks.DeliveryReport()
    assert receiver.requests == []


# --- the kick, the task, the views ---------------------------------------------------------


class VisibilityOutbox(RecordingOutbox):
    """Records, with each send, how many job events a new session could see right then."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world
        self.visible: list[int] = []

    def send(self, task: str, **kwargs: Any) -> bool:
        with self.world.rt.sessions() as session:
            self.visible.append(len(session.scalars(select(JobEvent.id)).all()))
        return super().send(task, **kwargs)


def test_the_delivery_task_is_sent_through_the_outbox_after_the_commit(cb):
    outbox = VisibilityOutbox(cb)
    cb.rt.outbox = outbox
    callbacks.send_after_commit(cb.rt)

    job_id = intake.submit_job(
        cb.rt, EnqueueJob(caller_key="j1", definition="tiny-job", net="net-a")
    ).enqueued.job_id
    assert outbox.sent == [(names.DELIVER_CALLBACKS, {}), (names.ASSIGN_NEXT_JOB, {})]
    assert outbox.visible[0] == 1  # the QUEUED event was committed when the task was sent

    outbox.sent.clear()
    with pytest.raises(RuntimeError), cb.rt.sessions.begin() as session:
        services.get_job(session, job_id).fail(
            "about to roll back", cb.clock(), ReasonCode.REPORTED_ERROR
        )
        session.flush()
        raise RuntimeError("the use case failed after its move")
    assert outbox.sent == []  # a rolled-back move sends nothing
    with cb.rt.sessions.begin() as session:
        services.sync_nets(session, cb.rt.settings, cb.clock())  # no job moved
    assert outbox.sent == []

    intake.request_abort(cb.rt, job_id, "user")
    assert (names.DELIVER_CALLBACKS, {}) in outbox.sent


def test_the_task_delivers_and_comes_back_when_the_next_event_is_due(cb, monkeypatch):
    from tasks import base
    from tasks.registered import TASKS

    cb.enqueue("j1", net="net-a")
    # Nothing listens there: the real HTTP sender gets "connection refused" at once.
    settings = cb.rt.settings.model_copy(update={"callback_url": "http://127.0.0.1:9/cb"})
    monkeypatch.setattr(cb.rt, "settings", settings)
    base.set_runtime(cb.rt)
    try:
        with (
            mock.patch.object(TASKS[names.DELIVER_CALLBACKS], "retry", side_effect=Retry) as retry,
            pytest.raises(Retry),
        ):
            TASKS[names.DELIVER_CALLBACKS].run()
    finally:
        base.set_runtime(None)
    assert retry.call_args.kwargs == {"countdown": 2.0, "max_retries": None}
    assert "Connect" in receiver_row(cb).last_error


def test_job_detail_and_metrics_show_what_is_undelivered(cb, receiver):
    job_id = cb.enqueue("j1", net="net-a")
    cb.clock.advance(30)
    receiver.down = True
    deliver(cb, receiver)
    with cb.rt.sessions() as session:
        view = job_detail(session, job_id, callbacks=True)
        assert job_detail(session, job_id)["callbacks"] is None  # callbacks off
        snap = read_snapshot(session, cb.clock(), callbacks=True)
    assert view["callbacks"]["pending"] == 1 and view["callbacks"]["delivered"] == 0
    assert "Connection refused" in view["callbacks"]["last_error"]
    assert (snap.callback_undelivered, snap.callback_oldest_undelivered_s) == (1, 30.0)
    named = {f.name: f for f in families(snap)}
    assert named["fl_dispatcher_callback_undelivered_events"].samples[0].value == 1

    receiver.down = False
    cb.clock.advance(10)
    deliver(cb, receiver)
    with cb.rt.sessions() as session:
        snap = read_snapshot(session, cb.clock(), callbacks=True)
        job = session.get(Job, job_id)
    assert (snap.callback_undelivered, snap.callback_oldest_undelivered_s) == (0, 0.0)
    assert job is not None


def test_a_kick_that_cannot_be_sent_never_fails_the_committed_move(cb):
    class BrokenOutbox(RecordingOutbox):
        def send(self, task: str, **kwargs: Any) -> bool:
            raise RuntimeError("the broker client blew up")

    cb.rt.outbox = BrokenOutbox()
    callbacks.send_after_commit(cb.rt)
    job_id = cb.enqueue("j1", net="net-a")  # would raise out of commit() otherwise
    assert cb.job(job_id).state == JobState.QUEUED


@pytest.mark.parametrize("enabled", [True, False])
def test_every_door_kicks_delivery_through_the_real_broker(tmp_path, job_root, sqlite_url, enabled):
    """celery_runtime is what a worker, the status API and the CLI build: with callbacks on,
    an enqueue puts deliver_callbacks on the pipeline queue beside assign_next_job's kick."""
    from app.celery_app import celery_runtime
    from tests.unit.test_celery_app import queued_tasks

    broker = tmp_path / "broker.db"
    extra = {} if enabled else {"CALLBACK_URL": "", "CALLBACK_SECRET": ""}
    settings = callback_settings(
        tmp_path,
        job_root,
        DATABASE_URL=sqlite_url,
        BROKER_URL=f"sqla+sqlite:///{broker}",
        **extra,
    )
    rt = celery_runtime(settings)
    try:
        intake.submit_job(rt, EnqueueJob(caller_key="j1", definition="tiny-job", net="net-a"))
    finally:
        rt.close()
    expected = [names.DELIVER_CALLBACKS] if enabled else []
    assert queued_tasks(broker, names.PIPELINE_QUEUE) == expected
    assert queued_tasks(broker) == [names.ASSIGN_NEXT_JOB]


# --- rejected enqueues -----------------------------------------------------------------------


@pytest.fixture
def task_rt(cb):
    """The worker's door: tasks run as functions on the world's runtime."""
    from tasks import base

    base.set_runtime(cb.rt)
    yield cb
    base.set_runtime(None)


def rejection_row(world: World, caller_key: str | None) -> RejectedRequest:
    with world.rt.sessions() as session:
        row = session.scalar(
            select(RejectedRequest)
            .where(
                RejectedRequest.caller_key.is_(None)
                if caller_key is None
                else RejectedRequest.caller_key == caller_key
            )
            .order_by(RejectedRequest.id.desc())
        )
        assert row is not None
        return row


def test_a_refused_enqueue_is_pushed_as_a_rejected_event_signed_with_its_own_id(task_rt, receiver):
    from tasks.registered import TASKS

    cb = task_rt
    refused = TASKS[names.ENQUEUE_JOB].run(
        payload={"caller_key": "flip-run-9", "definition": "tiny-job", "net": "nope"}
    )
    no_key = TASKS[names.ENQUEUE_JOB].run(payload={"definition": "tiny-job"})
    row = rejection_row(cb, "flip-run-9")

    report = deliver(cb, receiver)
    assert (report.delivered, report.failed, report.retry_in_s) == (2, 0, None)
    (first, headers, _), (second, _, _) = receiver.requests  # each signed (Receiver checks)
    assert first == {
        "event_id": f"rejected-{row.id}",
        "kind": "rejected",
        "job_id": str(job_id_for("flip-run-9")),
        "caller_key": "flip-run-9",
        "reason": refused["rejected"],
        "reason_code": "rejected",
        "at": cb.clock().isoformat(),
    }
    assert "unknown net 'nope'" in first["reason"]
    assert headers["X-FL-Dispatcher-Event-Id"] == f"rejected-{row.id}"
    assert (second["kind"], second["job_id"], second["caller_key"]) == ("rejected", None, None)
    assert second["reason"] == no_key["rejected"]

    assert deliver(cb, receiver).delivered == 0  # delivered once, not again
    assert len(receiver.requests) == 2
    assert rejection_row(cb, "flip-run-9").callback_settled_at == cb.clock()


def test_a_refused_enqueue_retried_after_its_commit_reply_was_lost_is_one_rejected_event(
    cb, receiver
):
    """The refusal is stored but the commit's reply is lost, so the task is retried (the
    database could not confirm it: README "What flip-api may rely on": every request is
    idempotent, a repeat changes nothing). The retry must not record the refusal again:
    flip-api would get two `rejected` events, with two event ids, for one request."""
    from app.handlers import HANDLERS, Verdict, on_error

    handler = HANDLERS[names.ENQUEUE_JOB]
    payload = {"caller_key": "flip-run-9", "definition": "tiny-job", "net": "nope"}
    with commit_reply_lost(cb.rt.engine), pytest.raises(Exception) as lost:
        handler.call(cb.rt, payload=payload)
    assert on_error(handler, lost.value, 0, cb.rt.settings) is Verdict.RETRY
    handler.call(cb.rt, payload=payload)  # the retry
    deliver(cb, receiver)
    assert [p["kind"] for p, _, _ in receiver.requests] == ["rejected"]


def test_a_conflict_retried_after_a_lost_reply_once_its_job_moved_is_one_rejected_event(
    cb, receiver
):
    """README "What flip-api may rely on": a retry after a commit applied whose reply was
    lost changes nothing (a refusal recorded once, one `rejected` event). The retry comes
    seconds later (backoff); meanwhile the job the key names has moved on (QUEUED to
    RUNNING): the refusal's text (it names the state) must not make it a second one."""
    from app.handlers import HANDLERS, Verdict, on_error

    handler = HANDLERS[names.ENQUEUE_JOB]
    job_id = cb.enqueue("flip-run-11", net="net-a")
    deliver(cb, receiver)
    receiver.requests.clear()
    payload = {"caller_key": "flip-run-11", "definition": "tiny-job", "net": "net-a"}
    conflicting = {**payload, "priority": 7}
    with commit_reply_lost(cb.rt.engine), pytest.raises(Exception) as lost:
        handler.call(cb.rt, payload=conflicting)
    assert on_error(handler, lost.value, 0, cb.rt.settings) is Verdict.RETRY
    cb.run_pipeline(job_id)  # the job moves on during the retry's backoff
    assert cb.job(job_id).state != JobState.QUEUED
    handler.call(cb.rt, payload=conflicting)  # the retry
    deliver(cb, receiver)
    assert [p["kind"] for p, _, _ in receiver.requests if p["kind"] == "rejected"] == ["rejected"]


def test_rejected_event_ids_never_collide_with_job_event_ids(cb, receiver):
    """Both sequences start at 1: the receiver dedups by event_id, so a rejected event must
    never carry an id a job event has (or will have)."""
    job_id = cb.enqueue("j1", net="net-a")
    intake.reject_enqueue(cb.rt, "j2", "unknown net 'x'")
    with cb.rt.sessions() as session:
        [job_event] = session.scalars(select(JobEvent.id)).all()
    assert job_event == rejection_row(cb, "j2").id == 1  # the raw ids do coincide

    deliver(cb, receiver)
    (rejected, rejected_headers, _), (queued, queued_headers, _) = receiver.requests
    # Rejected events go first in a round; the QUEUED event is the job's own.
    assert (rejected["kind"], queued["kind"]) == ("rejected", "state_change")
    assert (rejected["event_id"], queued["event_id"]) == ("rejected-1", 1)
    assert queued["job_id"] == str(job_id)
    assert (
        rejected_headers["X-FL-Dispatcher-Event-Id"] != queued_headers["X-FL-Dispatcher-Event-Id"]
    )


def test_a_rejected_event_the_receiver_does_not_accept_holds_back_nothing_else(cb, receiver):
    intake.reject_enqueue(cb.rt, "bad", "unknown net 'x'")
    job_id = cb.enqueue("j1", net="net-a")
    complete(cb, job_id)
    receiver.rule = lambda p: 503 if p["kind"] == "rejected" else 200

    report = deliver(cb, receiver)
    assert receiver.accepted(job_id) == LIFE  # the job's events went on
    assert report.retry_in_s == 2.0  # the one wake-up: when the rejected event is due again
    row = rejection_row(cb, "bad")
    assert row.callback_settled_at is None
    assert row.callback_last_error == f"event rejected-{row.id}: HTTP 503: nope"
    with cb.rt.sessions() as session:
        assert callbacks.backlog(session).undelivered == 1

    cb.clock.advance(1)
    deliver(cb, receiver)
    assert receiver.sent().count((f"rejected-{row.id}", "rejected")) == 1  # not before its backoff
    receiver.rule = lambda p: 200
    cb.clock.advance(1)
    assert deliver(cb, receiver).delivered == 1
    assert receiver.accepted() == [*LIFE, "rejected"]


def test_a_rejected_event_refused_by_the_receiver_is_given_up_after_the_4xx_limit(cb, receiver):
    intake.reject_enqueue(cb.rt, "bad", "unknown net 'x'")
    receiver.rule = lambda p: 400
    for _ in range(10):
        deliver(cb, receiver)
        cb.clock.advance(10)
    assert [kind for _, kind in receiver.sent()] == ["rejected"] * 3  # CALLBACK_MAX_4XX_TRIES
    row = rejection_row(cb, "bad")
    assert row.callback_failed and row.callback_settled_at is not None
    assert row.callback_last_error == (
        f"event rejected-{row.id}: HTTP 400: nope (rejected 3 times: given up)"
    )
    with cb.rt.sessions() as session:
        backlog = callbacks.backlog(session)
    assert (backlog.undelivered, backlog.failed) == (0, 1)


def test_a_silent_receiver_gets_a_rejected_event_once_it_answers(cb, receiver):
    intake.reject_enqueue(cb.rt, "bad", "unknown net 'x'")
    receiver.down = True
    report = deliver(cb, receiver)
    assert report.retry_in_s == 2.0 and receiver_row(cb).failures == 1
    assert "Connection refused" in rejection_row(cb, "bad").callback_last_error

    receiver.down = False
    cb.clock.advance(2)
    assert deliver(cb, receiver).delivered == 1
    assert receiver.accepted() == ["rejected"]
    assert receiver_row(cb).failures == 0


def test_a_deliverer_that_lost_its_lease_records_no_rejected_event(cb, receiver):
    intake.reject_enqueue(cb.rt, "bad", "unknown net 'x'")

    def taken_over() -> None:
        with cb.rt.sessions.begin() as session:
            session.execute(update(CallbackReceiver).values(lease_owner="someone-else"))

    receiver.during_post = taken_over
    assert deliver(cb, receiver).delivered == 0
    assert rejection_row(cb, "bad").callback_settled_at is None

    receiver.during_post = None
    cb.clock.advance(callback_receiver._lease_s(cb.rt) + 1)
    deliver(cb, receiver)
    (first, _), (again, _) = receiver.sent()
    assert first == again  # the same event_id again
    assert rejection_row(cb, "bad").callback_settled_at is not None


def test_an_undelivered_rejection_outlives_its_retention_until_it_is_delivered(cb, receiver):
    retention = cb.rt.settings.rejected_retention_s
    intake.reject_enqueue(cb.rt, "old", "unknown net 'x'")
    receiver.down = True
    deliver(cb, receiver)
    cb.clock.advance(retention + 1)
    intake.reject_enqueue(cb.rt, "new", "unknown net 'x'")  # purges what is past retention
    with cb.rt.sessions() as session:
        assert enqueue.get_rejection(session, job_id_for("old")) is not None  # not delivered

    receiver.down = False
    assert deliver(cb, receiver).delivered == 2
    assert [p["caller_key"] for p, _, _ in receiver.requests] == ["old", "new"]
    cb.clock.advance(retention + 1)
    intake.reject_enqueue(cb.rt, "newer", "unknown net 'x'")
    with cb.rt.sessions() as session:
        assert enqueue.get_rejection(session, job_id_for("old")) is None  # delivered: purged
        assert enqueue.get_rejection(session, job_id_for("new")) is None


def test_a_rejection_kicks_delivery_after_its_commit(cb):
    class Outbox(RecordingOutbox):
        visible: list[int]

        def send(self, task: str, **kwargs: Any) -> bool:
            with cb.rt.sessions() as session:
                self.visible.append(len(session.scalars(select(RejectedRequest.id)).all()))
            return super().send(task, **kwargs)

    outbox = Outbox()
    outbox.visible = []
    cb.rt.outbox = outbox
    callbacks.send_after_commit(cb.rt)
    intake.reject_enqueue(cb.rt, "bad", "unknown net 'x'")
    assert outbox.sent == [(names.DELIVER_CALLBACKS, {})]
    assert outbox.visible == [1]  # the row was committed when the task was sent


def test_metrics_count_an_undelivered_rejected_event(cb, receiver):
    intake.reject_enqueue(cb.rt, "bad", "unknown net 'x'")
    cb.clock.advance(30)
    receiver.down = True
    deliver(cb, receiver)
    with cb.rt.sessions() as session:
        snap = read_snapshot(session, cb.clock(), callbacks=True)
    assert (snap.callback_undelivered, snap.callback_oldest_undelivered_s) == (1, 30.0)


def test_callbacks_off_keep_no_rejection_past_its_retention_and_send_nothing(
    tmp_path, job_root, sqlite_factory, clock, receiver
):
    world = World(
        callback_settings(tmp_path, job_root, CALLBACK_URL="", CALLBACK_SECRET=""),
        sqlite_factory,
        clock,
    )
    intake.reject_enqueue(world.rt, "old", "unknown net 'x'")
    assert deliver(world, receiver) == callbacks.DeliveryReport()
    clock.advance(world.rt.settings.rejected_retention_s + 1)
    intake.reject_enqueue(world.rt, "new", "unknown net 'x'")
    with world.rt.sessions() as session:
        assert enqueue.get_rejection(session, job_id_for("old")) is None
    assert receiver.requests == []


def test_a_reused_caller_key_with_another_payload_is_a_rejected_event_and_changes_nothing(
    task_rt, receiver
):
    from tasks.registered import TASKS

    cb = task_rt
    payload = {"caller_key": "flip-run-10", "definition": "tiny-job", "net": "net-a"}
    first = TASKS[names.ENQUEUE_JOB].run(payload=payload)
    assert TASKS[names.ENQUEUE_JOB].run(payload=payload) == {**first, "created": False}
    conflict = TASKS[names.ENQUEUE_JOB].run(payload={**payload, "priority": 7})
    assert conflict["reason_code"] == "caller_key_conflict"
    assert conflict["rejected"].startswith(
        f"caller_key 'flip-run-10' already names job {first['job_id']}"
    )
    row = rejection_row(cb, "flip-run-10")
    assert (row.reason_code, row.job_id) == ("caller_key_conflict", job_id_for("flip-run-10"))
    assert cb.job(uuid.UUID(first["job_id"])).priority == 0

    deliver(cb, receiver)
    rejected = [p for p, _, _ in receiver.requests if p["kind"] == "rejected"]
    assert [(p["reason_code"], p["job_id"]) for p in rejected] == [
        ("caller_key_conflict", first["job_id"])
    ]


@pytest.mark.parametrize(
    "url",
    [
        "http://u:pw-in-url@127.0.0.1:abc/x",  # a port that is not a number
        "http://[::1/cb",  # an unclosed IPv6 host
        "https://flip-api:70000/cb",  # a port out of range: unreachable for ever
        "http://pw-in-url@/cb",  # no host at all: likewise
    ],
)
def test_a_callback_url_the_client_cannot_use_is_refused_at_start(tmp_path, job_root, url):
    """Accepted, the first two failed every delivery round with the client's invalid-URL
    error (an exception, not a back-off), the others never reached anything; the message
    names the rule, not the value."""
    with pytest.raises(SettingsError, match="CALLBACK_URL") as refused:
        callback_settings(tmp_path, job_root, CALLBACK_URL=url)
    assert "pw-in-url" not in str(refused.value)


def test_a_callback_url_with_an_uppercase_scheme_is_accepted(tmp_path, job_root):
    # A scheme is case-insensitive (RFC 3986), and the client sends to it as https.
    url = "HTTPS://flip-api/cb"
    assert callback_settings(tmp_path, job_root, CALLBACK_URL=url).callback_url == url


def test_a_callback_url_with_a_port_and_credentials_is_accepted(tmp_path, job_root):
    url = "https://flip:pw@flip-api.internal:8443/callbacks?x=1"
    assert callback_settings(tmp_path, job_root, CALLBACK_URL=f" {url} ").callback_url == url


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1]x/cb",  # text after the IPv6 host's bracket
        "http://[::1]]/cb",  # a stray bracket
        "http://[v1.x]/cb",  # an IPvFuture host the client does not take
        "http://256.1.1.1/cb",  # an IPv4 address out of range
        "http://flip\tapi/cb",  # a control character inside
        "http://flip-api/cb\x7f",
        "http://xn--/cb",  # a punycode label with nothing after its prefix
        "http://flip..api/cb",  # an empty label: the resolver's IDNA codec raises
        "http://" + "a" * 64 + ".example/cb",  # a label longer than 63: likewise
    ],
)
def test_a_callback_url_the_client_parses_but_cannot_send_to_is_refused_at_start(
    tmp_path, job_root, url
):
    """Accepted at start (urlsplit reads a host and no bad port), each made every delivery
    round raise the client's InvalidURL, IDNAError or UnicodeError instead of backing off."""
    with pytest.raises(SettingsError, match="CALLBACK_URL"):
        callback_settings(tmp_path, job_root, CALLBACK_URL=url)


def test_a_raw_at_sign_in_the_callback_urls_password_is_refused(tmp_path, job_root):
    """The client reads the password up to the last '@' (p@ss-in-url), the log filter and
    redact_url up to the first: 'ss-in-url' was left readable in every redacted line."""
    with pytest.raises(SettingsError, match="%40") as refused:
        callback_settings(tmp_path, job_root, CALLBACK_URL="http://u:p@ss-in-url@flip-api/cb")
    assert "ss-in-url" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1]:8080/cb",
        "http://[fe80::1%25eth0]:8080/cb",
        "https://flip:p%40ss@flip-api.internal:8443/cb?x=1",
        "http://flip-api.internal./cb",  # a fully qualified name's trailing dot
        "http://flip-\u00e4pi.example/cb",  # an internationalised name
        "http://u@flip-api/cb",
    ],
)
def test_valid_callback_urls_are_still_accepted(tmp_path, job_root, url):
    assert callback_settings(tmp_path, job_root, CALLBACK_URL=f"{url}  ").callback_url == url

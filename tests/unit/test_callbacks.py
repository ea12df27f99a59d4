"""Status callbacks: the signing scheme, and the delivery use case's ordering, retry and
give-up rules (one job's events in order, no job holding back another, one receiver's
backoff capped), driven by the real use cases on an embedded database with a recording
receiver in place of HTTP (tests/integration/test_callbacks_http.py does it over HTTP).
Refused enqueues' events: test_callback_rejections.py; the settings:
test_callback_settings.py; the real HTTP sender: test_callback_sender.py."""

from __future__ import annotations

import json
import re
import time
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
from app.metrics.exposition import families
from app.metrics.read import read_snapshot
from app.runtime import RecordingOutbox
from app.schemas import EnqueueJob
from app.usecases import callbacks, declared_nets, enqueue, intake, monitor, records
from app.usecases.callbacks import receiver as callback_receiver
from models import CallbackReceiver, Job, JobEvent, JobState, ReasonCode
from tests.unit.callback_world import (
    LIFE,
    SECRET,
    Receiver,
    callback_settings,
    cb,
    complete,
    deliver,
    receiver,
    receiver_row,
    status,
)
from tests.unit.conftest import World
from tests.unit.test_webhook_signatures import MALFORMED_CASES, malformed_webhook_requests

__all__ = ["cb", "receiver"]  # the fixtures, used by name

README = Path(__file__).resolve().parents[2] / "tasks" / "README.md"  # "Status callbacks"


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
    assert status(cb, job_id).model_dump() == {
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
    assert status(cb, a).pending == 3
    assert status(cb, a).last_error == f"event {a_assigned}: HTTP 503: nope"
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


def test_a_receiver_that_times_out_on_one_jobs_event_never_starves_the_others(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Scenario: flip-api's handler hangs on job A's event (a lock, a slow model lookup): every
    try of it ends in a read timeout (ReceiverUnreachable), while every other event is
    answered 200 at once. Job A's head event is the oldest, so it is always tried first, the
    round stops and the whole receiver rests; job B's QUEUED event is never sent, round after
    round. Promise (tasks/README.md "Status callbacks"): one job never holds back another / one bad
    payload holds back nothing. Fix: after a no-answer, resume with the jobs after the one
    that failed (round-robin), or move a job whose own event keeps timing out while others
    are answered to a per-job backoff."""
    from app.adapters.callbacks import Answer
    from app.usecases import callbacks

    world = World(callback_settings(tmp_path, job_root), sqlite_factory, clock)
    job_a = world.enqueue("k-slow", net="net-a")
    job_b = world.enqueue("k-fine", net="net-a")
    delivered: list[str] = []

    class HangsOnA:
        def post(self, body: bytes, headers) -> Answer:
            payload = json.loads(body)
            if payload["job_id"] == str(job_a):
                raise ReceiverUnreachable("ReadTimeout: timed out")
            delivered.append(payload["job_id"])
            return Answer(200)

        def close(self) -> None:
            pass

    for _ in range(20):  # 20 rounds, each after the receiver's rest (capped at 10 s)
        callbacks.deliver_callbacks(world.rt, sender=HangsOnA())
        world.clock.advance(11)
    assert str(job_b) in delivered


def test_one_undeliverable_job_holds_back_no_other(tmp_path, job_root, sqlite_factory, clock):
    from app.usecases import callbacks

    world = World(callback_settings(tmp_path, job_root), sqlite_factory, clock)
    receiver = Receiver()
    with world.rt.sessions.begin() as session:  # stored before payloads were checked
        bad = enqueue.enqueue_job(
            session,
            world.rt.settings,
            EnqueueJob.model_construct(
                caller_key="bad",
                definition="tiny-job",
                required_sites=["site-1"],
                net="net-a",
                priority=0,
                max_attempts=None,
                metadata={"model": "\ud800"},
            ),
            world.clock(),
        ).job_id
    good = world.enqueue("good", net="fixed")
    report = deliver(world, receiver)
    assert receiver.accepted(good) == ["QUEUED"]
    assert report.failed == 1
    with world.rt.sessions() as session:
        status = callbacks.delivery_status(session, bad)
    assert (status.failed, status.pending) == (1, 0)
    assert "undeliverable" in status.last_error


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
    # other is not down, only the first job waits), each rest counted once: 2, 4, 8 s,
    # then CALLBACK_MAX_BACKOFF_S
    assert tries == [1] * 6
    assert waits == [2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert receiver.requests == []

    receiver.down = False
    deliver(cb, receiver)
    assert receiver.accepted(first) == ["QUEUED"] and receiver.accepted(second) == ["QUEUED"]
    assert receiver_row(cb).failures == 0
    assert status(cb, first).last_error == (
        f"event {receiver.sent(first)[0][0]}: ConnectError: [Errno 111] Connection refused"
    )


@pytest.mark.parametrize("tries", [1024, 1025, 10**6])
def test_backoff_after_any_number_of_tries_is_the_cap(tries):
    from app.usecases.callbacks.verdicts import backoff_s

    assert backoff_s(tries, 300.0) == 300.0


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
    assert (got.delivered, got.failed, got.pending) == (4, 1, 0)
    assert got.last_error.endswith(
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
    assert status(cb, job_id).failed == 0 and status(cb, job_id).pending == 1
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
    assert status(cb, job_id).pending == 1  # the answer was not recorded

    receiver.during_post = None
    cb.clock.advance(callback_receiver._lease_s(cb.rt) + 1)
    deliver(cb, receiver)
    (first, _), (again, _) = receiver.sent()
    assert first == again  # a duplicate carries the same event_id
    assert status(cb, job_id).delivered == 1


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
    assert deliver(cb, receiver).retry_in_s == 2.0  # j1's backoff (one failure rests nothing)
    cb.enqueue("j2", net="fixed")  # its kick tries j2 (fails too): the wake-up is due then
    assert deliver(cb, receiver).retry_in_s is None
    cb.clock.advance(2)  # the scheduled retry runs, both fail (the second rests the receiver
    # 2 s; j1's second backoff, 4 s, is the later), schedules the next one
    assert deliver(cb, receiver).retry_in_s == 4.0
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
        records.get_job(session, job_id).fail(
            "about to roll back", cb.clock(), ReasonCode.REPORTED_ERROR
        )
        session.flush()
        raise RuntimeError("the use case failed after its move")
    assert outbox.sent == []  # a rolled-back move sends nothing
    with cb.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, cb.rt.settings, cb.clock())  # no job moved
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
        assert job_detail(session, job_id).callbacks is None  # callbacks off
        snap = read_snapshot(session, cb.clock(), callbacks=True)
    assert view.callbacks is not None
    assert view.callbacks.pending == 1 and view.callbacks.delivered == 0
    assert view.callbacks.last_error is not None
    assert "Connection refused" in view.callbacks.last_error
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


def test_beat_sweeps_callbacks_only_when_they_are_on(cb, settings):
    assert beat_schedule(cb.rt.settings)["deliver-callbacks"]["task"] == names.DELIVER_CALLBACKS
    assert "deliver-callbacks" not in beat_schedule(settings)

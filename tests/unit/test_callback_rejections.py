"""Status callbacks of refused enqueues: each refusal flip-api's request met (a bad payload, a
caller key reused with another payload) is pushed once as a `rejected` event, signed with
an id of its own, retried and given up by the delivery rules of job events, and kept past
its retention until delivered; with callbacks off nothing is sent or kept."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import select, update

from app import names
from app.adapters.callbacks import Answer, ReceiverUnreachable
from app.metrics.read import read_snapshot
from app.runtime import RecordingOutbox
from app.schemas import job_id_for
from app.usecases import callbacks, enqueue, intake
from app.usecases.callbacks import receiver as callback_receiver
from models import CallbackReceiver, JobEvent, JobState, RejectedRequest
from tests.unit.callback_world import (
    LIFE,
    Receiver,
    callback_settings,
    cb,
    complete,
    deliver,
    receiver,
    receiver_row,
)
from tests.unit.conftest import World
from tests.unit.lost_commit_reply import commit_reply_lost

__all__ = ["cb", "receiver"]  # the fixtures, used by name


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
    database could not confirm it: tasks/README.md "What flip-api may rely on": every request is
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
    """tasks/README.md "What flip-api may rely on": a retry after a commit applied whose reply was
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
    intake.record_refusal(cb.rt, "j2", "unknown net 'x'")
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
    intake.record_refusal(cb.rt, "bad", "unknown net 'x'")
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


class HangsOnRejections(Receiver):
    """A receiver up for state changes whose handler of `rejected` events times out."""

    def post(self, body: bytes, headers) -> Answer:
        if b'"kind":"rejected"' in body:
            raise ReceiverUnreachable("ReadTimeout: timed out")
        return super().post(body, headers)


def test_rejected_events_whose_handler_hangs_never_hold_back_a_jobs_events(cb):
    """tasks/README.md, "Rejected events": each one is held back only by its own answers,
    never holds back a job's events. Two of them go first in the round and both go
    unanswered: after the first's silence the other event tried is the job's, so it is sent
    in that round."""
    job = cb.enqueue("accepted", net="fixed")
    for key in ("refused-1", "refused-2"):
        intake.record_refusal(cb.rt, key, "unknown net 'net-9' (known: net-a, fixed)")
    receiver = HangsOnRejections()
    assert deliver(cb, receiver).delivered == 1
    assert receiver.accepted(job) == ["QUEUED"]
    with cb.rt.sessions() as session:
        assert callbacks.backlog(session).undelivered == 2  # each rejected event backs off


def test_a_rejected_event_refused_by_the_receiver_is_given_up_after_the_4xx_limit(cb, receiver):
    intake.record_refusal(cb.rt, "bad", "unknown net 'x'")
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
    intake.record_refusal(cb.rt, "bad", "unknown net 'x'")
    receiver.down = True
    report = deliver(cb, receiver)
    # One failure with nothing else due: that event backs off (2 s), the receiver does not rest.
    assert report.retry_in_s == 2.0 and receiver_row(cb).next_attempt_at is None
    assert "Connection refused" in rejection_row(cb, "bad").callback_last_error

    receiver.down = False
    cb.clock.advance(2)
    assert deliver(cb, receiver).delivered == 1
    assert receiver.accepted() == ["rejected"]
    assert receiver_row(cb).failures == 0


def test_a_deliverer_that_lost_its_lease_records_no_rejected_event(cb, receiver):
    intake.record_refusal(cb.rt, "bad", "unknown net 'x'")

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
    intake.record_refusal(cb.rt, "old", "unknown net 'x'")
    receiver.down = True
    deliver(cb, receiver)
    cb.clock.advance(retention + 1)
    intake.record_refusal(cb.rt, "new", "unknown net 'x'")  # purges what is past retention
    with cb.rt.sessions() as session:
        assert enqueue.get_rejection(session, job_id_for("old")) is not None  # not delivered

    receiver.down = False
    assert deliver(cb, receiver).delivered == 2
    # the fewest tries first: "new" was never tried, "old" once
    assert [p["caller_key"] for p, _, _ in receiver.requests] == ["new", "old"]
    cb.clock.advance(retention + 1)
    intake.record_refusal(cb.rt, "newer", "unknown net 'x'")
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
    intake.record_refusal(cb.rt, "bad", "unknown net 'x'")
    assert outbox.sent == [(names.DELIVER_CALLBACKS, {})]
    assert outbox.visible == [1]  # the row was committed when the task was sent


def test_metrics_count_an_undelivered_rejected_event(cb, receiver):
    intake.record_refusal(cb.rt, "bad", "unknown net 'x'")
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
    intake.record_refusal(world.rt, "old", "unknown net 'x'")
    assert deliver(world, receiver) == callbacks.DeliveryReport()
    clock.advance(world.rt.settings.rejected_retention_s + 1)
    intake.record_refusal(world.rt, "new", "unknown net 'x'")
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

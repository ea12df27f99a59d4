"""Refused enqueues, one refusal per request (tasks/README.md "What flip-api may rely on",
"Rejected events"): a request answered `rejected` never becomes a job, whichever copy of its
message comes later (a retry, a redelivery, a publish duplicate: one Celery task id), and a
payload Celery's serializer decodes to values JSON has no form for is refused and recorded,
never lost. Each test failed on the code before its fix (break-it on the first version of
0022's one-refusal-per-request, which looked a refusal up on retries only)."""

from __future__ import annotations

import pytest

from app import names
from app.errors import InvalidRequest
from app.schemas import job_id_for
from app.usecases import intake
from models import Job, ReasonCode
from tests.unit.callback_world import Receiver, cb, deliver, receiver
from tests.unit.conftest import World

__all__ = ["cb", "receiver"]  # the fixtures, used by name

MESSAGE_ID = "0f6d3a1e-7c2b-4e5f-9a10-3b4c5d6e7f80"  # one Celery task id


def _enqueue_task():
    from app.handlers import HANDLERS

    return HANDLERS[names.ENQUEUE_JOB]


def _upload(world: World, name: str) -> None:
    """flip-api's upload of the job definition becomes visible under JOB_ROOT."""
    folder = world.rt.settings.job_root / name / "app" / "config"
    folder.mkdir(parents=True)
    (world.rt.settings.job_root / name / "meta.json").write_text(
        f'{{"name": "{name}", "deploy_map": {{"app": ["@ALL"]}}, "min_clients": 2}}'
    )


def _job_exists(world: World, caller_key: str) -> bool:
    with world.rt.sessions() as session:
        return session.get(Job, job_id_for(caller_key)) is not None


def test_a_publish_duplicate_of_a_refused_message_never_becomes_a_job(
    cb: World, receiver: Receiver
):
    """Promise: a request answered `rejected` never becomes a job; the copies of one message
    (one Celery task id) are one request. Sequence: flip-api's publish of the enqueue is
    retried by kombu's producer (the broker's reply to the first LPUSH lost), so the queue
    holds two copies with the same task id, neither a Celery retry nor a broker redelivery
    (retries=0, delivery_info.redelivered unset). Copy 1 is refused (the definition's upload
    is not visible yet) and its `rejected` event is delivered; the upload becomes visible;
    copy 2 was not `retried`, so the refusal kept for its message id was not consulted: it
    was judged again and accepted, a job created for the request flip-api was told was
    rejected. Now an enqueue that creates a job reads whether its message was refused
    before, in the statement it reads anyway (`kicks.EnqueueKick`), and rolls back."""
    handler = _enqueue_task()
    payload = {"caller_key": "flip-run-17", "definition": "late-upload", "net": "net-a"}
    first = handler.call(cb.rt, **handler.kwargs({"payload": payload}, MESSAGE_ID))
    assert "rejected" in first
    deliver(cb, receiver)
    assert [p["kind"] for p, _, _ in receiver.requests] == ["rejected"]
    _upload(cb, "late-upload")
    second = handler.call(cb.rt, **handler.kwargs({"payload": payload}, MESSAGE_ID))
    assert "rejected" in second, f"copy 2 of the refused message was accepted: {second}"
    assert not _job_exists(cb, "flip-run-17")


def test_a_copy_accepted_while_the_first_records_its_refusal_is_one_job_and_no_refusal(
    cb: World, receiver: Receiver, monkeypatch
):
    """Promise: a request is never both answered `rejected` and a job; the copies of one
    message (one Celery task id) are one request. Sequence: two copies of one message (a
    visibility timeout restored it: copy 2 flagged redelivered) run at once in two workers.
    Copy 1 judges the payload (definition not visible) and is about to record its refusal;
    the upload becomes visible; copy 2 looks for the refusal by its message id, finds none
    yet, judges again and creates the job; copy 1 then recorded the refusal and its
    `rejected` event (a strict xfail until 0.3.11). Now the refusal's record reads the job
    its key names first (waiting for an enqueue of it in flight on PostgreSQL: `id_probe`),
    and the same request's job is copy 1's answer too: nothing is refused."""
    handler = _enqueue_task()
    payload = {"caller_key": "flip-run-18", "definition": "racy-upload", "net": "net-a"}
    real = intake.refuse_enqueue
    seen: list[dict] = []

    def refuse_while_copy_2_runs(rt, sent, exc, message_id=None):
        if not seen:
            _upload(cb, "racy-upload")  # visible between copy 1's judgement and its record
            seen.append(handler.call(rt, **handler.kwargs({"payload": sent}, message_id)))
        return real(rt, sent, exc, message_id)

    monkeypatch.setattr(intake, "refuse_enqueue", refuse_while_copy_2_runs)
    first = handler.call(cb.rt, **handler.kwargs({"payload": payload}, MESSAGE_ID))
    deliver(cb, receiver)
    kinds = [p["kind"] for p, _, _ in receiver.requests]
    job_id = str(job_id_for("flip-run-18"))
    assert seen[0]["job_id"] == job_id and seen[0]["created"] is True
    assert "rejected" not in kinds, f"a job and a `rejected` event: copy 1 answered {first}"
    assert first == {"job_id": job_id, "created": False, "state": "QUEUED"}
    assert _job_exists(cb, "flip-run-18")


def test_a_repeat_accepted_while_a_copy_records_its_refusal_keeps_the_copys_refusal(
    cb: World, receiver: Receiver
):
    """The other side of the rule: a message refused before stays refused (its copies are
    answered from that refusal, `RefusedBefore`), even when the same payload sent again as a
    new message (flip-api's repeat after the upload) made the job since. A copy of the
    refused message judged again (the folder gone once more) is not answered with that
    job: its refusal stands."""
    handler = _enqueue_task()
    payload = {"caller_key": "flip-run-20", "definition": "late-again", "net": "net-a"}
    first = handler.call(cb.rt, **handler.kwargs({"payload": payload}, MESSAGE_ID))
    assert first["reason_code"] == "rejected"
    _upload(cb, "late-again")
    repeat = handler.call(cb.rt, **handler.kwargs({"payload": payload}, "another-message"))
    assert repeat["created"] is True
    refused = intake.refuse_enqueue(
        cb.rt, payload, InvalidRequest("definition 'late-again' not found"), MESSAGE_ID
    )
    assert refused == ReasonCode.REJECTED  # the message's first refusal, not the job


@pytest.mark.parametrize(
    "message_id",
    ["flip-run-31/" + "t" * 300, "flip-run-31/\x00nul", "flip-run-31/\ud800"],
    ids=["longer-than-the-column", "nul", "lone-surrogate"],
)
def test_a_copy_of_a_refused_message_with_an_odd_task_id_never_becomes_a_job(
    cb: World, receiver: Receiver, message_id: str
):
    """Promise: no copy of a refused message creates a job, whatever it reads as now.
    Sequence (break-it 22): flip-api names its own task ids (`send_task(task_id=...)`), one
    longer than refused_messages.message_id's 255 characters, or holding a NUL or a lone
    surrogate. Copy 1 is refused (the upload not visible yet), its `rejected` event
    delivered; the upload shows up; copy 2 was judged again and created the job: the id was
    never recorded ("matched by key only"), so no look could find copy 1's refusal. Now such
    an id is stored as its head and its SHA-256 (`recordable_message_id`)."""
    payload = {"caller_key": "flip-run-31", "definition": "late-31", "net": "net-a"}
    handler = _enqueue_task()
    first = handler.call(cb.rt, **handler.kwargs({"payload": payload}, message_id))
    assert first["reason_code"] == "rejected"
    deliver(cb, receiver)
    assert [p["kind"] for p, _, _ in receiver.requests] == ["rejected"]
    _upload(cb, "late-31")
    copy = handler.call(cb.rt, **handler.kwargs({"payload": payload}, message_id))
    assert "rejected" in copy and not _job_exists(cb, "flip-run-31"), (
        f"copy 1 answered {first} (its `rejected` event delivered); copy 2 answered {copy}"
    )


def _as_received(payload: dict) -> dict:
    """The task's kwargs as a worker decodes them: Celery's json serializer is kombu's, which
    encodes a UUID, datetime, Decimal... as {"__type__": ...} and decodes it back."""
    from kombu.utils.json import dumps, loads

    return loads(dumps({"payload": payload}))


def test_metadata_kombu_decodes_to_a_uuid_is_refused_not_dropped(cb: World, receiver: Receiver):
    """Promise: nothing flip-api sends is lost; a refused payload (bad metadata) creates no
    job, is recorded, and is one `rejected` event. Sequence: flip-api (Python) puts FLIP's
    model_id in the metadata as a `uuid.UUID`; kombu's json carries it to the worker as a
    UUID. `EnqueueJob._metadata` (the line this diff changed to count UTF-8) calls
    json.dumps on it, which raises TypeError, not ValueError: pydantic passes it through,
    `parse_payload` does not catch it, `on_error` calls it FAILED, and Celery acks the
    failed message (acks_on_failure_or_timeout): no job, no refusal row, no event; the job's
    id reads "not found" for ever. (`payload_digest` guards the same TypeError; the
    validator does not.)"""
    import uuid

    handler = _enqueue_task()
    payload = {
        "caller_key": "flip-run-19",
        "definition": "tiny-job",
        "net": "net-a",
        "metadata": {"model_id": uuid.UUID(int=1)},
    }
    answer = handler.call(cb.rt, **handler.kwargs(_as_received(payload), "m-uuid-1"))
    assert "rejected" in answer
    deliver(cb, receiver)
    assert [p["kind"] for p, _, _ in receiver.requests] == ["rejected"]


def test_two_payloads_without_a_digest_under_one_key_are_two_refusals(
    cb: World, receiver: Receiver
):
    """Promise: "another payload under the same `caller_key` is another request and another
    event" (tasks/README.md, Rejected events). Sequence: flip-api sends a payload whose
    `definition` it built as a datetime by mistake (kombu carries it as a datetime): refused
    (`definition: Input should be a valid string`), and `payload_digest` cannot serialise
    it: no digest. flip-api then sends another payload under the key (another definition,
    the same mistake): refused with the same reason, and with no digest it is matched by
    key, code and reason alone (`_same_rejection`'s fallback for "calls without digest"
    also takes rows that have one): taken for the first, one row and one `rejected` event
    for two requests."""
    from datetime import datetime

    handler = _enqueue_task()
    for n, message in ((1, "m-dt-1"), (2, "m-dt-2")):
        payload = {"caller_key": "flip-run-20", "definition": datetime(2026, 1, n), "net": "net-a"}
        answer = handler.call(cb.rt, **handler.kwargs(_as_received(payload), message))
        assert "rejected" in answer
    deliver(cb, receiver)
    kinds = [p["kind"] for p, _, _ in receiver.requests]
    assert kinds == ["rejected", "rejected"], f"two refused payloads, events: {kinds}"


def test_a_refused_payload_whose_key_kombu_decodes_to_bytes_is_recorded_under_its_key(
    cb: World, receiver: Receiver
):
    """kombu's json carries bytes back as bytes; pydantic reads a bytes `caller_key` as its
    text, so such a request is the key's, but its refusal was recorded under no key (the
    raw payload's key kept only as a str): flip-api could not find it by its key."""
    from sqlalchemy import select

    from models import RejectedRequest

    handler = _enqueue_task()
    payload = {"caller_key": b"flip-run-21", "definition": "tiny-job", "net": "nope"}
    answer = handler.call(cb.rt, **handler.kwargs(_as_received(payload), "m-bytes-1"))
    assert answer["caller_key"] == "flip-run-21"
    with cb.rt.sessions() as session:
        assert session.scalars(select(RejectedRequest.caller_key)).all() == ["flip-run-21"]


def test_a_copy_of_a_refused_message_rolled_back_logs_no_job_enqueued(
    cb: World, receiver: Receiver, caplog: pytest.LogCaptureFixture
):
    """The log says what was stored: copy 2 of a refused message (the upload visible by then)
    inserts the job, reads that its message was refused before and rolls back. "job enqueued"
    was written at the insert, for a job that never existed."""
    handler = _enqueue_task()
    payload = {"caller_key": "flip-run-18", "definition": "late-upload-2", "net": "net-a"}
    handler.call(cb.rt, **handler.kwargs({"payload": payload}, MESSAGE_ID))
    _upload(cb, "late-upload-2")
    with caplog.at_level("INFO"):
        second = handler.call(cb.rt, **handler.kwargs({"payload": payload}, MESSAGE_ID))
    assert "rejected" in second and not _job_exists(cb, "flip-run-18")
    assert [r for r in caplog.records if r.getMessage() == "job enqueued"] == []
    with caplog.at_level("INFO"):
        payload = {**payload, "caller_key": "flip-run-19"}
        handler.call(cb.rt, **handler.kwargs({"payload": payload}, "another-message"))
    logged = [r for r in caplog.records if r.getMessage() == "job enqueued"]
    assert [r.__dict__["caller_key"] for r in logged] == ["flip-run-19"]

"""A refused enqueue is one refusal per request (tasks/README.md "What flip-api may rely on"):
Celery's retry or redelivery of it (the same task id) is answered as it was first, never
judged again; flip-api's own repeat of the same payload (another message) is the same
refusal; another payload under the same key is another request, recorded. Each test
failed on the code before the fix (break-it on migration 0022's first version)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app import names
from app.handlers import HANDLERS, Verdict, on_error
from models import Job, RefusedMessage, RejectedRequest
from tests.unit.callback_world import cb, deliver, receiver
from tests.unit.lost_commit_reply import commit_reply_lost

__all__ = ["cb", "receiver"]  # the fixtures, used by name

M1 = "5b0e4d1c-1f0a-4d7e-9a43-2f6c8d1e7a90"  # one Celery task id, across its retries
M2 = "9c1d2e3f-0000-4a4a-8b8b-123456789abc"
M3 = "0a1b2c3d-1111-4b4b-9c9c-abcdefabcdef"


def _enqueue():
    return HANDLERS[names.ENQUEUE_JOB]


def _call(world, payload, message_id):
    handler = _enqueue()
    return handler.call(world.rt, **handler.kwargs({"payload": payload}, message_id))


def _rejections(world) -> list[tuple[str | None, str, list[str]]]:
    """Each refusal kept: its key, its code, and the messages it answered."""
    with world.rt.sessions() as session:
        return [
            (
                r.caller_key,
                r.reason_code,
                list(
                    session.scalars(
                        select(RefusedMessage.message_id).where(RefusedMessage.rejection_id == r.id)
                    )
                ),
            )
            for r in session.scalars(select(RejectedRequest).order_by(RejectedRequest.id))
        ]


def _jobs(world) -> list[str]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(Job.caller_key)))


def test_a_refusal_retried_after_a_lost_reply_creates_no_job_once_the_request_reads_valid(
    cb, receiver
):
    """tasks/README.md "What flip-api may rely on": a retry after a commit that was applied but
    whose reply was lost changes nothing ("a refusal recorded once, one `rejected` event
    ... a retry finds it by that [the task id] before judging the request again ... answers
    with the first code and records nothing"). The retry does NOT look first: the refusal
    is found by message id only when the retry is refused again. Sequence: an enqueue
    (caller_key flip-run-9) whose definition folder is not there yet (JOB_ROOT on a network
    file system that has not shown flip-api's upload yet) is refused, its commit applied,
    its reply lost; the folder shows up; Celery's retry (same task id) judges the request
    again, finds it valid and CREATES THE JOB. flip-api got a `rejected` event for the
    request and then the job's QUEUED event: one request, two contradicting outcomes."""
    handler = _enqueue()
    payload = {"caller_key": "flip-run-9", "definition": "late-job", "net": "net-a"}
    with commit_reply_lost(cb.rt.engine), pytest.raises(Exception) as lost:
        _call(cb, payload, M1)
    assert on_error(handler, lost.value, 0, cb.rt.settings) is Verdict.RETRY
    assert [code for _, code, _ in _rejections(cb)] == ["rejected"]  # the first try's, stored
    deliver(cb, receiver)  # its `rejected` event goes out
    (cb.rt.settings.job_root / "late-job").mkdir()  # the upload is visible now
    retried = _call(cb, payload, M1)  # Celery's retry: the same task id
    deliver(cb, receiver)
    kinds = [p.get("to_state") or p["kind"] for p, _, _ in receiver.requests]
    assert "created" not in retried and _jobs(cb) == [], (retried, kinds)


def test_a_distinct_refused_request_under_the_same_key_is_recorded(cb, receiver):
    """ "Two different requests (different Celery task ids) that are both refused must each be
    recorded"; tasks/README.md "Rejected events": "A rejected event is about one request".
    Sequence: flip-api sends {flip-run-7, definition missing-def, priority 1} (task M1): refused
    (`definition 'missing-def' is not a folder under the job root`). It then sends another
    request under the key, priority 7 (task M2, a different payload: by the enqueue's own
    rule not a repeat). It is refused with the same reason, and record_rejection's
    fallback (key, code, reason) returns the first row although the message ids differ
    (both stored): the second request is swallowed, no row, no `rejected` event for it."""
    first = {"caller_key": "flip-run-7", "definition": "missing-def", "net": "net-a", "priority": 1}
    second = {**first, "priority": 7}
    _call(cb, first, M1)
    deliver(cb, receiver)
    _call(cb, second, M2)
    deliver(cb, receiver)
    assert [m for _, _, m in _rejections(cb)] == [[M1], [M2]]


def test_a_repeat_delivered_after_the_corrected_request_is_no_second_refusal(cb, receiver):
    """ "Every flip-api request is idempotent: a repeat ... changes nothing: a refusal recorded
    once, one `rejected` event". The round fixed this for Celery's retry (same task id) but
    not for flip-api's own repeat of the same payload (a new send, a new task id; the
    client's send_task names none), which is the dedup the key/code/reason match exists for.
    Sequence: flip-api sends a bad enqueue (unknown net) under flip-run-5 (M1) and, unsure
    of the send, repeats it (M3); M3's first try meets a database that cannot answer and
    waits out a backoff. M1 is refused (`rejected`), its event delivered; flip-api sends the
    corrected request (M2), which creates the job. M3 then runs: the same payload now reads
    as a conflict with that job, another code and reason, so the key/code/reason match
    misses and a second refusal is recorded: flip-api gets a `caller_key_conflict` event
    for a request it already got `rejected` for (and may take it for the corrected job's)."""
    bad = {"caller_key": "flip-run-5", "definition": "tiny-job", "net": "nope"}
    _call(cb, bad, M1)
    deliver(cb, receiver)
    corrected = {**bad, "net": "net-a"}
    assert _call(cb, corrected, M2)["created"] is True
    _call(cb, bad, M3)  # flip-api's repeat of the first request, delivered late
    deliver(cb, receiver)
    rejected = [p["reason_code"] for p, _, _ in receiver.requests if p["kind"] == "rejected"]
    assert rejected == ["rejected"]

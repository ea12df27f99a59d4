"""Review round 16 (break-it): promises fl-dispatcher makes flip-api about its status
callbacks that the code did not keep (tasks/README.md "Status callbacks", "Rejected events",
"What flip-api may rely on"; app/entrypoints/README.md "Metrics"). Each test names the
promise; one still marked xfail is a defect left open, with the fix its reason suggests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from app import names
from app.adapters.callbacks import Answer
from app.local.receiver import PATH
from app.metrics.read import read_snapshot
from app.usecases import callbacks, intake
from tests.unit.callback_world import Receiver, cb, deliver, receiver
from tests.unit.conftest import World
from tests.unit.lost_commit_reply import commit_reply_lost
from tests.unit.test_callback_sender import servers, world_with_receiver_at

__all__ = ["cb", "receiver", "servers"]  # the fixtures, used by name


def _failed_total(world: World) -> int:
    """fl_dispatcher_callback_failed_events_total as a scrape reads it."""
    with world.rt.sessions.begin() as session:
        return read_snapshot(session, world.clock(), callbacks=True).callback_failed


def test_pruning_a_given_up_rejected_event_never_lowers_the_failed_events_counter(cb, receiver):
    """`fl_dispatcher_callback_failed_events_total` is a counter ("Pruning history no longer
    lowers a counter"), and FlDispatcherCallbackGivenUp pages on its `increase(...[1h])`: a
    fall reads to Prometheus as a reset, whose increase is the whole remaining count, so
    the page fires for events given up long ago. A given-up rejected event is pruned with
    its row once past REJECTED_RETENTION_S (by the next refusal), and the counter, read
    live from the rows, fell with it."""
    intake.record_refusal(cb.rt, "bad", "unknown net 'x'")
    receiver.rule = lambda payload: 400
    for _ in range(5):  # CALLBACK_MAX_4XX_TRIES (3) rejections, the backoff between
        deliver(cb, receiver)
        cb.clock.advance(10)
    assert _failed_total(cb) == 1
    cb.clock.advance(cb.rt.settings.rejected_retention_s + 1)
    intake.record_refusal(cb.rt, "later", "unknown net 'y'")  # prunes what is past retention
    assert _failed_total(cb) == 1


MESSAGE_ID = "5b0e4d1c-1f0a-4d7e-9a43-2f6c8d1e7a90"  # one Celery task id, across its retries


def _enqueue_task(world: World):
    from app.handlers import HANDLERS

    return HANDLERS[names.ENQUEUE_JOB]


def test_a_keyless_refusal_retried_after_its_commit_reply_was_lost_is_one_rejected_event(
    cb, receiver
):
    """tasks/README.md "What flip-api may rely on": a retry after a commit that was applied
    but whose reply was lost changes nothing ("a refusal recorded once, one `rejected`
    event"). A payload without a caller_key is deduplicated by nothing (record_rejection
    looked for the same refusal by its key only), so the retry recorded it again: two
    `rejected` events, two event ids, for one request. The row keeps the broker message's
    id (Celery's task id, the same across its retries) and a retry finds it by that first,
    whatever its key."""
    from app.handlers import Verdict, on_error

    handler = _enqueue_task(cb)
    payload = {"definition": "tiny-job", "net": "net-a"}  # no caller_key
    with commit_reply_lost(cb.rt.engine), pytest.raises(Exception) as lost:
        handler.call(cb.rt, **handler.kwargs({"payload": payload}, MESSAGE_ID))
    assert on_error(handler, lost.value, 0, cb.rt.settings) is Verdict.RETRY
    handler.call(cb.rt, **handler.kwargs({"payload": payload}, MESSAGE_ID))  # the retry
    deliver(cb, receiver)
    assert [p["kind"] for p, _, _ in receiver.requests] == ["rejected"]


def test_a_refusal_retried_after_a_lost_reply_stays_one_event_once_its_key_names_a_job(
    cb, receiver
):
    """The same promise, one request later: an enqueue refused (`rejected`: unknown net) whose
    commit reply is lost is retried after a backoff (2 s and up, RETRY_BACKOFF_MAX_S); the
    refusal was stored and its event delivered meanwhile, so flip-api may have sent the
    corrected request under the same key, which created the job. The retry then reads as a
    conflict with that job and is recorded as a second refusal, `caller_key_conflict`:
    flip-api got two `rejected` events, with two codes, for the one request it sent. The
    refusal already recorded for this message (its id) is found before the request is
    judged again, and the retry answers with the code first recorded."""
    from app.handlers import Verdict, on_error

    handler = _enqueue_task(cb)
    bad = {"caller_key": "flip-run-5", "definition": "tiny-job", "net": "nope"}
    with commit_reply_lost(cb.rt.engine), pytest.raises(Exception) as lost:
        handler.call(cb.rt, **handler.kwargs({"payload": bad}, MESSAGE_ID))
    assert on_error(handler, lost.value, 0, cb.rt.settings) is Verdict.RETRY
    deliver(cb, receiver)  # the refusal was stored: its event goes out
    corrected = {**bad, "net": "net-a"}
    assert handler.call(cb.rt, payload=corrected, message_id="m-2")["created"] is True
    # The lost-reply retry of the first request, answered as it was first.
    retried = handler.call(cb.rt, **handler.kwargs({"payload": bad}, MESSAGE_ID))
    assert retried["reason_code"] == "rejected"
    deliver(cb, receiver)
    rejected = [p["reason_code"] for p, _, _ in receiver.requests if p["kind"] == "rejected"]
    assert rejected == ["rejected"]


# Headers that make httpx's reading of an answer's body raise: a Content-Encoding the body
# is not in (DecodingError), a charset naming a codec that is not a text encoding
# (LookupError from bytes.decode). Neither is a TransportError.
UNDECODABLE_ANSWERS = {
    "gzip-label": ("Content-Encoding", "gzip"),
    "hex-charset": ("Content-Type", "text/plain; charset=hex"),
}


@pytest.mark.parametrize("header", UNDECODABLE_ANSWERS.values(), ids=UNDECODABLE_ANSWERS.keys())
def test_a_receiver_answer_whose_body_cannot_be_decoded_holds_back_no_other_job(
    servers, tmp_path, job_root, sqlite_factory, clock, header
):
    """ "Any other answer ... only that job waits; other jobs go on", and "Never in the
    pipeline's way". A receiver (or a proxy before it) that answers one job's event with a
    body its headers misdescribe (labelled `Content-Encoding: gzip` but not gzip; a charset
    such as `hex`, a codec but no text encoding) made the sender raise something other than
    ReceiverUnreachable: the round ended with it before recording anything, and the next
    round tried the same event first again, so no other job's event was ever sent. The
    status line had come: it is the answer."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        body = b"stored"
        handler.send_response(200)
        if handler.headers["webhook-id"] == "1":  # j1's first event, each time it is tried
            handler.send_header(*header)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    recorder = servers(answer)
    port = int(recorder.base.rsplit(":", 1)[1])
    world = world_with_receiver_at(port, tmp_path, job_root, sqlite_factory, clock)
    assert world.rt.settings.callback_url.endswith(PATH)
    world.enqueue("j1", net="net-a")
    world.enqueue("j2", net="net-a")
    for _ in range(2):
        callbacks.deliver_callbacks(world.rt)
        clock.advance(60)
    assert len(recorder.requests) >= 2  # j2's QUEUED went out too
    with world.rt.sessions() as session:
        assert callbacks.backlog(session).undelivered == 0


# Charsets that name a text codec whose decode raises UnicodeError with errors="replace"
# (idna refuses any handler but strict; `undefined` refuses every decode), not LookupError.
UNDECODABLE_CHARSETS = {
    "idna-charset": ("Content-Type", "text/plain; charset=idna"),
    "undefined-charset": ("Content-Type", "text/plain; charset=undefined"),
}


@pytest.mark.parametrize("header", UNDECODABLE_CHARSETS.values(), ids=UNDECODABLE_CHARSETS.keys())
def test_an_answer_in_a_charset_that_refuses_to_decode_holds_back_no_other_job(
    servers, tmp_path, job_root, sqlite_factory, clock, header
):
    """As the `hex` charset above, for codecs that are text encodings by name but whose
    decode raises UnicodeError (not LookupError) with errors="replace"."""
    test_a_receiver_answer_whose_body_cannot_be_decoded_holds_back_no_other_job(
        servers, tmp_path, job_root, sqlite_factory, clock, header
    )


def test_a_reason_code_written_by_a_newer_release_fails_no_status_api_read(cb, receiver):
    """tasks/README.md plans for a `reason_code` "this release does not know, written by a
    newer one before a rollback" (app/deploy/README.md "Rolling back": a release with no new
    migration needs no downgrade, and codes are added, never renamed): its callback is
    failed for good, and every other event goes on. The status API's read models take the
    code as a ReasonCode, so the same row made GET /jobs/{id} a 500, and GET /jobs a 500
    for every page that holds that job: one row hid the whole list from flip-api and the
    operators. Now such a code reads as null in the job's and its history's views (the
    `reason` keeps the words): a client validating against the contract's enum takes it."""
    from fastapi.testclient import TestClient
    from sqlalchemy import update

    from app.entrypoints.api import create_app
    from models import Job, JobEvent
    from tests.unit.callback_world import complete

    ended = cb.enqueue("ended", net="net-a")
    waiting = cb.enqueue("waiting", net="net-a")
    complete(cb, ended)
    with cb.rt.sessions.begin() as session:  # the newer release's end, before the rollback
        session.execute(update(Job).where(Job.id == ended).values(reason_code="newer_code"))
        session.execute(
            update(JobEvent)
            .where(JobEvent.job_id == ended, JobEvent.reason_code.is_not(None))
            .values(reason_code="newer_code")
        )
    assert deliver(cb, receiver).failed == 1  # the callbacks cope: that one event is given up
    with TestClient(create_app(cb.rt), raise_server_exceptions=False) as client:
        assert client.get(f"/jobs/{waiting}").status_code == 200
        listed = client.get("/jobs")
        assert listed.status_code == 200, listed.text
        assert {j["caller_key"] for j in listed.json()["jobs"]} == {"ended", "waiting"}
        shown = client.get(f"/jobs/{ended}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["reason_code"] is None
        assert shown.json()["history"][-1]["reason_code"] is None
        assert shown.json()["history"][-1]["reason"]  # the words are kept


# A definition the schema takes (at most 1024 characters) whose folder the file system will
# not look up: a name longer than a directory entry may be (255 bytes), a symlink loop.
UNREADABLE_DEFINITIONS = ["a" * 300, "tiny-job/" + "b" * 256, "loop"]


@pytest.mark.parametrize("definition", UNREADABLE_DEFINITIONS, ids=["long", "long-inner", "loop"])
def test_a_definition_the_file_system_cannot_look_up_is_refused_and_recorded(
    tmp_path, job_root, sqlite_factory, clock, receiver, definition
):
    """tasks/README.md: "A refused payload (... a folder outside the root ...) creates no
    job: it is logged as one line and recorded ..., and with CALLBACK_URL set it is pushed
    as a `rejected` event"; app/entrypoints/README.md: "rejected requests 400". A folder
    name past the file system's 255 bytes made `Path.is_dir()` raise OSError (ENAMETOOLONG
    is not among the errors pathlib reads as "not there"), a symlink loop made `resolve()`
    raise RuntimeError: POST /jobs answered 500, and the enqueue_job task raised, which
    app.handlers.on_error fails for good (not a database error): the request was dropped
    unrecorded, flip-api heard nothing, and its job stayed "not found" for ever. Suggested
    fix: `enqueue.resolve_definition` reads a lookup the file system refuses for the path
    itself (ENAMETOOLONG, ELOOP, the loop's RuntimeError) as InvalidRequest naming it."""
    from fastapi.testclient import TestClient

    from app.entrypoints.api import create_app
    from app.handlers import HANDLERS
    from tests.unit.callback_world import callback_settings

    (job_root / "loop").symlink_to("loop")
    key = "probe-api-key-0123456789"
    world = World(callback_settings(tmp_path, job_root, API_SECRET=key), sqlite_factory, clock)
    payload = {"caller_key": "flip-run-1", "definition": definition, "net": "net-a"}
    with TestClient(create_app(world.rt), raise_server_exceptions=True) as client:
        answer = client.post("/jobs", json=payload, headers={"X-API-Key": key})
    assert answer.status_code == 400, answer.text
    refused = HANDLERS[names.ENQUEUE_JOB].call(world.rt, payload=payload)
    assert refused["reason_code"] == "rejected"
    deliver(world, receiver)
    assert [p["kind"] for p, _, _ in receiver.requests] == ["rejected"]


@contextlib.contextmanager
def _text_refuses_nul_as_postgresql_does(engine) -> Iterator[None]:
    """PostgreSQL's text columns refuse a NUL (psycopg raises DataError before sending);
    SQLite stores it. Every statement on `engine` with a NUL in a string parameter fails
    here as it would there."""
    from sqlalchemy import event
    from sqlalchemy.exc import DataError

    def refuse(_conn, _cursor, statement, parameters, _context, _many) -> None:
        rows = parameters if isinstance(parameters, list) else [parameters]
        for row in rows:
            values = row.values() if isinstance(row, dict) else row
            if any(isinstance(v, str) and "\x00" in v for v in values):
                cause = ValueError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
                raise DataError(statement, row, cause)

    event.listen(engine, "before_cursor_execute", refuse)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", refuse)


def test_a_receiver_answer_with_a_nul_in_its_body_holds_back_no_other_job(cb):
    """ "A handler that hangs or fails on one event holds back no other job" (a 5xx, 408 or
    429 is tried like no answer). The answer's excerpt is kept
    in the cursor's last_error as the receiver sent it: a body with a NUL in it (UTF-16 text
    sent without its charset, a binary error page) cannot be stored in PostgreSQL's text,
    so the record of that try raised DataError (not a database outage), the round ended
    with it, and the next round tried the same event first again: no other job's event
    went out, on any round. (The project escapes NUL everywhere it stores outside words,
    `app.schemas.storable`; not here.) Suggested fix: the sender's excerpt goes through
    `storable` (or drops control characters) before it is an Answer."""
    first = cb.enqueue("j1", net="net-a")
    cb.enqueue("j2", net="net-a")

    class Utf16Receiver(Receiver):
        """Answers j1's events 500 with a UTF-16LE body read as UTF-8, the rest 200."""

        def post(self, body: bytes, headers) -> Answer:
            answer = super().post(body, headers)
            return Answer(answer.status, "e\x00r\x00r\x00") if answer.status >= 500 else answer

    utf16 = Utf16Receiver()
    utf16.rule = lambda payload: 500 if payload["job_id"] == str(first) else 200
    with _text_refuses_nul_as_postgresql_does(cb.rt.engine):
        for _ in range(2):
            with contextlib.suppress(Exception):
                deliver(cb, utf16)
            cb.clock.advance(60)
    assert "QUEUED" in utf16.accepted()  # j2's, whatever j1's answer was
    with cb.rt.sessions() as session:
        kept = callbacks.delivery_status(session, first).last_error
    assert kept is not None and kept.endswith(r"HTTP 500: e\x00r\x00r\x00")  # escaped


def test_an_enqueue_whose_definition_lookup_fails_for_the_file_system_is_kept(
    tmp_path, job_root, sqlite_factory, clock, monkeypatch
):
    """ "What flip-api may rely on": the request is carried out, or refused and recorded,
    never acknowledged away. resolve_definition re-raises a lookup error that is not the
    path's own fault (EIO: a JOB_ROOT on a network file system that cannot answer now) as
    "not the request's fault", and the enqueue_job task then fails for good (OSError is no
    database error): no job, no refusal, no event, the caller's only copy gone. Kept like
    a database that cannot answer now, it is tried again once the file system answers."""
    import errno
    from pathlib import Path

    from app.handlers import HANDLERS, Verdict, on_error
    from tests.unit.callback_world import callback_settings

    world = World(callback_settings(tmp_path, job_root), sqlite_factory, clock)
    real_is_dir = Path.is_dir

    def failing_is_dir(self: Path) -> bool:
        if self.name == "tiny-job":
            raise OSError(errno.EIO, "Input/output error")
        return real_is_dir(self)

    monkeypatch.setattr(Path, "is_dir", failing_is_dir)
    handler = HANDLERS[names.ENQUEUE_JOB]
    payload = {"caller_key": "flip-run-1", "definition": "tiny-job", "net": "net-a"}
    with pytest.raises(Exception) as raised:
        handler.call(world.rt, payload=payload)
    assert on_error(handler, raised.value, 0, world.rt.settings) is Verdict.RETRY
    # Over HTTP: 503, the caller's cue to send it again (it was a 500).
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from app.entrypoints.api import create_app

    key = "test-api-secret-0123456789abcdef"
    world.rt.settings = world.rt.settings.model_copy(update={"api_secret": SecretStr(key)})
    with TestClient(create_app(world.rt), raise_server_exceptions=False) as client:
        answer = client.post("/jobs", json=payload, headers={"X-API-Key": key})
    assert answer.status_code == 503, answer.text
    assert "Input/output" not in answer.text  # the detail is in the log only


def test_the_celery_task_s_retry_after_a_lost_commit_reply_finds_its_refusal_by_task_id(cb):
    """Through the real registered task and Celery's own retry (run eagerly: `Task.retry`
    applies the copy it would send, with the options it would send it with): the refusal's
    commit is applied and its reply lost, the task retries under the same task id, and that
    retry finds the row its first try stored. One row, keyed by the task id."""
    from sqlalchemy import select

    from models import RefusedMessage
    from tasks import base
    from tasks.registered import TASKS

    payload = {"definition": "tiny-job", "net": "net-a"}  # no caller_key
    base.set_runtime(cb.rt)
    try:
        with commit_reply_lost(cb.rt.engine) as commits:
            result = TASKS[names.ENQUEUE_JOB].apply(kwargs={"payload": payload}, task_id=MESSAGE_ID)
    finally:
        base.set_runtime(None)
    # The retry ran (the first try raised) and was answered as the first.
    assert result.state == "SUCCESS" and result.result["reason_code"] == "rejected"
    assert commits[0] == 2
    with cb.rt.sessions() as session:
        rows = session.execute(select(RefusedMessage.message_id)).scalars().all()
    assert rows == [MESSAGE_ID]

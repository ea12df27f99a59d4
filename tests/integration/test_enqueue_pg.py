"""An enqueue on PostgreSQL inserts without reading first (app.usecases.enqueue): a failed
insert inside its savepoint must leave the transaction usable there too, both when the key
names a job (a repeat) and when the net it names has no row yet (a deploy that added it,
before any worker started); and one refused enqueue handled twice at once is recorded once
(`record_rejection`'s lock per caller key)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event, func, select

from app.runtime import RecordingOutbox, Runtime
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases import callbacks, declared_nets, enqueue, requests
from models import Job, JobEvent, Net, RejectedRequest
from tests.fakes import fake_runtime
from tests.fixtures.db import net_decl
from tests.unit.callback_world import SECRET

pytestmark = pytest.mark.integration


def _enqueue(pg_factory, settings, clock, key: str, **kw):
    request = EnqueueJob(caller_key=key, definition="tiny-job", **kw)
    with pg_factory.begin() as session:
        return enqueue.enqueue_job(session, settings, request, clock())


def test_an_enqueue_before_the_nets_have_rows_creates_them_and_the_job(pg_factory, settings, clock):
    stored = _enqueue(pg_factory, settings, clock, "k", net="net-b")
    assert stored.created
    with pg_factory() as session:
        assert sorted(session.scalars(select(Net.name))) == ["net-a", "net-b"]
        assert session.get(Job, stored.job_id).requested_net == "net-b"


def test_a_repeat_is_answered_by_its_job_and_writes_nothing(pg_factory, settings, clock):
    first = _enqueue(pg_factory, settings, clock, "k", net="net-a")
    again = _enqueue(pg_factory, settings, clock, "k", net="net-a")
    assert (again.job_id, again.created) == (first.job_id, False)
    with pg_factory() as session:
        assert session.scalar(select(func.count()).select_from(JobEvent)) == 1


def test_two_enqueues_of_one_key_before_the_nets_have_rows_answer_with_one_job(
    pg_factory, settings, clock, monkeypatch
):
    """Both inserts fail on the missing net row; both make the rows and insert again: one
    wins, and the other's second insert fails on the key and answers with the winner's job
    (a repeat), not the IntegrityError."""
    both_failed_once = threading.Barrier(2, timeout=10)
    make_rows = declared_nets.ensure_net_rows

    def rows_once_both_failed(*args: Any) -> None:
        both_failed_once.wait()
        make_rows(*args)

    monkeypatch.setattr(declared_nets, "ensure_net_rows", rows_once_both_failed)
    enqueue_k = lambda: _enqueue(pg_factory, settings, clock, "k", net="net-a")  # noqa: E731
    answers = side_by_side(enqueue_k, enqueue_k)
    assert sorted(a.created for a in answers) == [False, True]
    assert answers[0].job_id == answers[1].job_id
    with pg_factory() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 1


@pytest.fixture
def rt(pg_factory, tmp_path, job_root, clock) -> Runtime:
    """The enqueue task's runtime on PostgreSQL, callbacks on (no driver, server or
    receiver is reached)."""
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "net-a"), net_decl(tmp_path, "net-b")]),
        CALLBACK_URL="http://flip-api.invalid/callbacks",
        CALLBACK_SECRET=SECRET,
    )
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    return fake_runtime(settings, pg_factory, clock, RecordingOutbox())


def payload(key: str, **kw: Any) -> dict[str, Any]:
    return {"caller_key": key, "definition": "tiny-job", **kw}


def side_by_side(*calls: Callable[[], Any]) -> list[Any]:
    """Run each call in its own thread (its own connection); their results, in order."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            results[i] = call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


def first_rejection_held(engine: Any, hold_s: float = 0.5) -> threading.Event:
    """The first INSERT INTO rejected_requests is held `hold_s` before its transaction goes
    on to commit; the event is set once it ran."""
    inserted = threading.Event()

    def after(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("INSERT INTO rejected_requests") and not inserted.is_set():
            inserted.set()
            threading.Event().wait(hold_s)

    event.listen(engine, "after_cursor_execute", after)
    return inserted


@pytest.mark.parametrize("refused", ["caller_key_conflict", "rejected"])
def test_the_same_refused_enqueue_handled_twice_at_once_is_one_rejection(rt, pg_factory, refused):
    """tasks/README.md, Task API: every request is idempotent, "a refusal recorded once, one
    `rejected` event". Two copies of one refused enqueue (flip-api's retry of a send it was
    unsure of, picked up by two workers) handled side by side."""
    requests.enqueue_job(rt, payload("k", net="net-a"))
    if refused == "caller_key_conflict":
        bad = payload("k", net="net-a", priority=5)  # the key names a job with another body
    else:
        bad = payload("n", net="net-9")  # an unknown net
    inserted = first_rejection_held(rt.engine)

    def the_copy() -> Any:
        inserted.wait(5)
        return requests.enqueue_job(rt, bad)

    first, copy = side_by_side(lambda: requests.enqueue_job(rt, bad), the_copy)
    assert first["reason_code"] == copy["reason_code"] == refused
    with pg_factory() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 1
        assert session.scalar(select(func.count()).select_from(RejectedRequest)) == 1
        assert callbacks.backlog(session).undelivered == 2  # the job's QUEUED, one rejected

"""What an enqueue costs and still answers once it no longer reads before it writes (issue
37): a new job is its insert and its first event, nothing read first; a repeat is found by
the insert its key refuses, and answered by the first job even when the request would no
longer pass validation; a net whose row no worker has created yet gets it on the way."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, func, select

from app.errors import InvalidRequest
from app.runtime import RecordingOutbox, Runtime
from app.schemas import EnqueueJob
from app.usecases import enqueue, intake, kicks
from models import Job, JobEvent, Net


@contextmanager
def statements(sessions) -> Iterator[list[str]]:
    """The statements an engine runs (SQLite's BEGIN IMMEDIATE left out)."""
    sent: list[str] = []
    engine = sessions.kw["bind"]

    def note(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        if not sql.startswith("BEGIN"):
            sent.append(sql.split(maxsplit=1)[0])

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", note)


@pytest.fixture
def rt(settings, sqlite_factory, clock) -> Runtime:
    """A runtime on a fresh database whose nets have no rows yet (no worker has started)."""
    return Runtime(
        settings=settings,
        engine=sqlite_factory.kw["bind"],
        sessions=sqlite_factory,
        clock=clock,
        outbox=RecordingOutbox(),
    )


def submit(rt: Runtime, key: str = "k", **kw: Any) -> enqueue.Enqueued:
    request = EnqueueJob(caller_key=key, definition="tiny-job", **kw)
    return intake.submit_job(rt, request).enqueued


def test_a_new_job_is_its_insert_and_its_first_event_then_one_look_for_an_early_abort(rt):
    """Nothing is read before the insert; after it, whether an abort came for the job's id
    first (app.usecases.early_aborts), read on its own where kicks are not coalesced (the
    status API, the CLI)."""
    submit(rt, "first", net="net-a")  # the nets' rows are created on the way
    with statements(rt.sessions) as sent:
        created = submit(rt, "second", net="net-a")
    assert created.created
    assert sent == ["SAVEPOINT", "INSERT", "INSERT", "RELEASE", "SELECT"]


def test_a_worker_s_enqueue_reads_the_early_abort_with_its_kick_s_marker(rt):
    """A worker's enqueue (coalesced kicks) reads the marker after the insert anyway: the
    look for an early abort is a column of that read, no statement of its own."""
    kicks.coalesce_kicks(rt)
    submit(rt, "first", net="net-a")
    with statements(rt.sessions) as sent:
        created = submit(rt, "second", net="net-a")
    assert created.created
    assert sent == ["SAVEPOINT", "INSERT", "INSERT", "RELEASE", "SELECT"]  # marker fresh


def test_an_enqueue_naming_a_net_without_a_row_yet_creates_the_row_and_the_job(rt):
    with rt.sessions.begin() as session:
        assert session.scalar(select(func.count()).select_from(Net)) == 0
        stored = enqueue.enqueue_job(
            session, rt.settings, EnqueueJob(caller_key="k", definition="tiny-job", net="net-b"),
            rt.clock(),
        )  # fmt: skip
    assert stored.created
    with rt.sessions() as session:
        assert sorted(session.scalars(select(Net.name))) == ["net-a", "net-b"]
        assert session.get(Job, stored.job_id).requested_net == "net-b"
        assert session.scalar(select(func.count()).select_from(JobEvent)) == 1


def test_a_repeat_is_answered_by_its_job_with_one_event(rt):
    first = submit(rt, "k", net="net-a")
    again = submit(rt, "k", net="net-a")
    assert (again.job_id, again.created) == (first.job_id, False)
    with rt.sessions() as session:
        assert session.scalar(select(func.count()).select_from(JobEvent)) == 1


def test_a_repeat_whose_request_no_longer_validates_is_still_answered_by_its_job(rt, job_root):
    """The first request was valid; its folder is gone since (or a net's sites changed): the
    repeat names the job it made, it is not refused."""
    first = submit(rt, "k", net="net-a")
    shutil.rmtree(job_root / "tiny-job")
    again = submit(rt, "k", net="net-a")
    assert (again.job_id, again.created) == (first.job_id, False)
    with pytest.raises(InvalidRequest, match="not a folder"):
        submit(rt, "other", net="net-a")

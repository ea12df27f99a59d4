"""Enqueues that decide their coalesced kick in the job's own transaction
(`kicks.kick_after_commit`), side by side on PostgreSQL: a burst that finds the marker stale
(its round queued behind more than `stale_after` of work, its message lost) must neither
deadlock nor fail an enqueue. Each one reads the marker share-locked; two that then both
upsert it would each wait for the other's share lock."""

from __future__ import annotations

import contextlib
import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, select, text

from app import names
from app.runtime import RecordingOutbox, Runtime
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases import declared_nets, intake, kicks
from models import Job, PendingKick
from tests.fakes import fake_runtime
from tests.fixtures.db import net_decl

pytestmark = pytest.mark.integration

STALE_AFTER = timedelta(seconds=15)


@pytest.fixture
def rt(pg_factory, tmp_path, job_root, clock) -> Runtime:
    """A worker's runtime on PostgreSQL with the coalescing outbox a worker wires."""
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "net-a")]),
    )
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    outbox = kicks.CoalescingOutbox(RecordingOutbox(), pg_factory, clock, STALE_AFTER)
    return fake_runtime(settings, pg_factory, clock, outbox)


def _meet_at_the_marker_write(engine: Any, parties: int) -> None:
    """Each sender's write of the marker waits (2 s at most) until `parties` senders reach
    theirs: the interleaving of a burst, where every enqueue read the stale marker before
    any wrote it. A sender that never gets there (it waits at its read) just goes on."""
    barrier = threading.Barrier(parties, timeout=2)

    def before(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("INSERT INTO pending_kicks"):
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()

    event.listen(engine, "before_cursor_execute", before)


def test_a_burst_of_enqueues_on_a_stale_marker_neither_deadlocks_nor_fails(rt, pg_factory, clock):
    task = names.ASSIGN_NEXT_JOB
    with pg_factory.begin() as session:
        session.add(PendingKick(task=task, sent_at=clock()))
    clock.advance(STALE_AFTER.total_seconds() + 1)  # its round never came: presumed lost
    _meet_at_the_marker_write(rt.engine, 2)
    errors: list[BaseException] = []
    sent: list[bool | None] = []

    def enqueue(key: str) -> None:
        request = EnqueueJob(caller_key=key, definition="tiny-job", required_sites=["site-1"])
        try:
            sent.append(intake.submit_job(rt, request).notified)
        except BaseException as exc:  # the thread's failure is the test's
            errors.append(exc)

    threads = [threading.Thread(target=enqueue, args=(k,)) for k in ("one", "two")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, [f"{type(e).__name__}: {str(e).splitlines()[0]}" for e in errors]
    with pg_factory() as session:
        assert sorted(session.scalars(select(Job.caller_key))) == ["one", "two"]
    assert rt.outbox.inner.sent.count((task, {})) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("repeat", ["the key's job", "a net with no row yet"])
def test_an_enqueue_whose_insert_failed_decides_its_kick_in_a_usable_transaction(
    rt, pg_factory, repeat
):
    """`enqueue_job` catches the IntegrityError of its insert (a repeat of the key, a net
    no worker has made a row for) inside the enqueue's transaction, in a savepoint: the
    marker's share-locked read and its upsert run after it in that same transaction."""
    if repeat == "a net with no row yet":
        with pg_factory.begin() as session:
            session.execute(text("DELETE FROM nets"))
    request = EnqueueJob(caller_key="k", definition="tiny-job", net="net-a")
    first = intake.submit_job(rt, request)
    assert first.notified is True
    with pg_factory.begin() as session:
        session.execute(text("DELETE FROM pending_kicks"))  # its round took the marker
    again = intake.submit_job(rt, request)
    assert (again.enqueued.job_id, again.enqueued.created) == (first.enqueued.job_id, False)
    assert again.notified is True
    assert rt.outbox.inner.sent.count((names.ASSIGN_NEXT_JOB, {})) == 2  # type: ignore[attr-defined]

"""Coalesced kicks on PostgreSQL: senders racing on real concurrent connections send one
kick between them (the unit tier's SQLite takes its write lock at BEGIN, so it never
reaches the upsert's conflict path)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from app import names
from app.runtime import RecordingOutbox, Runtime
from app.schemas import EnqueueJob
from app.usecases import declared_nets, enqueue, kicks
from models import Job, PendingKick

pytestmark = pytest.mark.integration

SENDERS = 8
STALE_AFTER = timedelta(seconds=15)


@pytest.fixture
def pg_factory(pg_factory, settings, clock):
    """The database with a QUEUED job that a free net can take: a kick is worth sending
    (without one, a sender only reads: app/usecases/kicks.py)."""
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
        request = EnqueueJob(caller_key="waiting", definition="tiny-job", required_sites=["s"])
        enqueue.enqueue_job(session, settings, request, clock())
    return pg_factory


def race(pg_factory, now) -> list[bool]:
    """SENDERS transactions that each decide whether to send, started together."""
    barrier = threading.Barrier(SENDERS, timeout=10)
    decisions: list[bool] = []

    def send() -> None:
        barrier.wait()
        with pg_factory.begin() as session:
            decided = kicks.mark_pending(session, names.ASSIGN_NEXT_JOB, now, now - STALE_AFTER)
        decisions.append(decided)

    threads = [threading.Thread(target=send) for _ in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert len(decisions) == SENDERS
    return decisions


def test_racing_senders_send_one_kick(pg_factory, clock):
    assert race(pg_factory, clock()).count(True) == 1


def test_racing_senders_replace_a_stale_marker_once(pg_factory, clock):
    with pg_factory.begin() as session:
        session.add(PendingKick(task=names.ASSIGN_NEXT_JOB, sent_at=clock()))
    clock.advance(STALE_AFTER.total_seconds() + 1)  # its message presumed lost
    assert race(pg_factory, clock()).count(True) == 1
    with pg_factory() as session:
        assert session.get(PendingKick, names.ASSIGN_NEXT_JOB).sent_at == clock()


def test_a_taken_marker_lets_the_next_sender_send(pg_factory, clock):
    now = clock()
    for expected in (True, False):
        with pg_factory.begin() as session:
            assert (
                kicks.mark_pending(session, names.ASSIGN_NEXT_JOB, now, now - STALE_AFTER)
                is expected
            )
    with pg_factory.begin() as session:
        kicks.take(session, names.ASSIGN_NEXT_JOB)
    with pg_factory.begin() as session:
        assert kicks.mark_pending(session, names.ASSIGN_NEXT_JOB, now, now - STALE_AFTER) is True


def test_a_round_taking_the_marker_while_an_enqueue_decides_in_its_transaction_sees_the_job(
    pg_factory, settings, clock
):
    """An enqueue that decides its kick in the job's own transaction (a fresh marker: none
    to send) and an assign round that takes that marker before the enqueue commits: the
    round's delete waits for the commit (the marker's row share-locked), so the claim read
    that follows it sees the job. Without the lock the round read the queue first and the
    job waited for beat's round, up to a housekeeping interval later."""
    task, now = names.ASSIGN_NEXT_JOB, clock()
    with pg_factory.begin() as session:
        session.add(PendingKick(task=task, sent_at=now))  # a kick on its way
    enqueuing = pg_factory()
    request = EnqueueJob(caller_key="late", definition="tiny-job", required_sites=["s"])
    job_id = enqueue.enqueue_job(enqueuing, settings, request, now).job_id
    outbox = kicks.CoalescingOutbox(RecordingOutbox(), pg_factory, clock, STALE_AFTER)
    rt = Runtime(settings, pg_factory.kw["bind"], pg_factory, clock, outbox=outbox)
    send = kicks.kick_after_commit(rt, enqueuing, task)  # the marker's row share-locked
    seen: list[bool] = []

    def assign_round() -> None:
        with pg_factory.begin() as session:
            kicks.take(session, task)
        with pg_factory() as session:
            seen.append(session.get(Job, job_id) is not None)

    round_ = threading.Thread(target=assign_round)
    round_.start()
    _wait_for_a_lock_wait_or(round_, pg_factory)
    enqueuing.commit()
    enqueuing.close()
    round_.join(timeout=10)
    assert seen == [True]
    assert send() is True and outbox.inner.sent == []  # the pending kick was counted on


def _wait_for_a_lock_wait_or(thread: threading.Thread, pg_factory) -> None:
    """Until another connection waits for a lock, or `thread` has ended (5 s at most)."""
    deadline = time.monotonic() + 5
    while thread.is_alive() and time.monotonic() < deadline:
        with pg_factory() as session:
            if session.scalar(text("SELECT count(*) FROM pg_locks WHERE NOT granted")):
                return
        time.sleep(0.02)

"""A row this transaction already locked is answered from the session (`app.usecases.rows`,
issue 37): read once, not once per use case that locks it; forgotten when the transaction
ends, committed or rolled back (a savepoint too); never seen by another session."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from app.errors import NotFound
from app.usecases import records
from models import JobEvent


@contextmanager
def reads(sessions) -> Iterator[list[str]]:
    """The SELECTs the engine runs meanwhile."""
    sent: list[str] = []
    engine = sessions.kw["bind"]

    def note(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        if sql.startswith("SELECT"):
            sent.append(sql)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", note)


def test_a_job_locked_twice_in_one_transaction_is_read_once(world):
    """What monitor's verdict does: lock the job, then `finish_job` locks it again."""
    job_id = world.enqueue("k", net="net-a")
    with world.rt.sessions.begin() as session, reads(world.rt.sessions) as sent:
        first = records.get_job(session, job_id, lock=True)
        again = records.get_job(session, job_id, lock=True)
        plain = records.get_job(session, job_id)
        assert again is first and plain is first
        net = records.get_net(session, "net-a", lock=True)
        assert records.get_net(session, "net-a", lock=True) is net
    assert len(sent) == 2  # the job once, the net once


def test_a_pending_change_is_flushed_as_the_read_it_replaces_would_have(world):
    job_id = world.enqueue("k", net="net-a")
    with world.rt.sessions.begin() as session:
        job = records.get_job(session, job_id, lock=True)
        job.priority = 7
        records.get_job(session, job_id, lock=True)
        assert not session.dirty  # flushed, as the query's autoflush did
    assert world.job(job_id).priority == 7


def test_a_rolled_back_transaction_forgets_what_it_locked(world):
    job_id = world.enqueue("k", net="net-a")
    session = world.rt.sessions()
    try:
        with session.begin():
            records.get_job(session, job_id, lock=True)
            session.rollback()
        with session.begin(), reads(world.rt.sessions) as sent:
            records.get_job(session, job_id, lock=True)
        assert len(sent) == 1  # locked again: the old lock went with the rollback
    finally:
        session.close()


def test_a_rolled_back_savepoint_forgets_what_it_locked(world):
    job_id = world.enqueue("k", net="net-a")
    with world.rt.sessions.begin() as session:
        savepoint = session.begin_nested()
        records.get_job(session, job_id, lock=True)
        savepoint.rollback()
        with reads(world.rt.sessions) as sent:
            records.get_job(session, job_id, lock=True)
        assert len(sent) == 1


def test_a_committed_transaction_forgets_what_it_locked(world):
    job_id = world.enqueue("k", net="net-a")
    session = world.rt.sessions()
    try:
        with session.begin():
            records.get_job(session, job_id, lock=True)
        with session.begin(), reads(world.rt.sessions) as sent:
            records.get_job(session, job_id, lock=True)
        assert len(sent) == 1
    finally:
        session.close()


def test_another_session_never_sees_a_lock_it_does_not_hold(world):
    job_id = world.enqueue("k", net="net-a")
    with world.rt.sessions.begin() as mine:
        records.get_job(mine, job_id, lock=True)
    other = world.rt.sessions()
    try:
        with reads(world.rt.sessions) as sent:
            records.get_job(other, job_id, lock=True)
        assert len(sent) == 1
    finally:
        other.close()


def test_a_row_deleted_in_the_transaction_is_not_answered_from_it(world):
    job_id = world.enqueue("k", net="net-a")
    with world.rt.sessions.begin() as session:
        session.query(JobEvent).filter_by(job_id=job_id).delete()
        session.delete(records.get_job(session, job_id, lock=True))
        session.flush()
        with pytest.raises(NotFound):
            records.get_job(session, job_id, lock=True)


def test_a_locked_row_the_caller_dropped_is_still_answered(world):
    """Monitor keeps only the state of the job it locks: the session's identity map holds
    rows weakly, so the memory of the lock must keep the row itself."""
    job_id = world.enqueue("k", net="net-a")
    with world.rt.sessions.begin() as session:
        state = records.get_job(session, job_id, lock=True).state
        gc.collect()
        with reads(world.rt.sessions) as sent:
            assert records.get_job(session, job_id, lock=True).state == state
        assert sent == []


def test_an_unlocked_read_leaves_the_lock_to_the_next_locked_read(world):
    """A plain read locks nothing (`lock` defaults to False): a later locked read of the row
    in the transaction runs its own SELECT (FOR UPDATE on PostgreSQL), not the memory's."""
    job_id = world.enqueue("k", net="net-a")
    with world.rt.sessions.begin() as session, reads(world.rt.sessions) as sent:
        records.get_job(session, job_id)
        records.get_job(session, job_id, lock=True)
        records.get_net(session, "net-a")
        records.get_net(session, "net-a", lock=True)
    assert len(sent) == 4  # each row read plain, then again to lock it


def test_a_net_with_no_row_is_not_found(world):
    with world.rt.sessions.begin() as session, pytest.raises(NotFound) as refused:
        records.get_net(session, "net-z")
    assert str(refused.value) == "net net-z not found"

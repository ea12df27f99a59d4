"""Drain against a claim on the real PostgreSQL (app/usecases/drains.py): a claim whose
locking statement took its snapshot before the drain's commit, and locks the net after it,
never lands on the drained net; so once `drain` (or `status`) says drained, no job is
claimed there."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import exists, func, literal, select, text

from app.usecases import claims, drains
from models import JobState
from tests.integration.test_pg_state import enqueue
from tests.unit.conftest import World

pytestmark = pytest.mark.integration

PAUSE_S = 0.6


@pytest.fixture
def db(pg_factory, settings, clock):
    from app.usecases import records

    with pg_factory.begin() as session:
        records.sync_nets(session, settings, clock())
    yield pg_factory
    with pg_factory.begin() as session:
        session.execute(text("DELETE FROM drains"))  # not in tests.fixtures.db.TABLES


def _slow_lock_net():
    """The claim's locking statement, pausing inside it (after its snapshot, before its
    row lock): the window a drain may commit in."""
    from models import Net

    pause = exists(select(literal(1)).select_from(func.pg_sleep(PAUSE_S)))
    return (
        select(Net)
        .where(Net.name == claims.bindparam("name"), pause, *claims._free())
        .with_for_update(skip_locked=True)
    )


def _until_the_claim_pauses(db, deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state = 'active' AND query LIKE '%pg_sleep%' AND pid <> pg_backend_pid()"
    )
    while time.monotonic() < deadline:
        with db() as session:
            if session.scalar(query):
                return
        time.sleep(0.01)
    pytest.fail("the claim never reached its locking statement")


def test_a_claim_racing_a_drain_never_lands_on_the_net_after_it_says_drained(
    db, settings, clock, monkeypatch
):
    job_id = enqueue(db, settings, clock, "racer", net="net-a")
    monkeypatch.setattr(claims, "_lock_net", _slow_lock_net)
    claimed: list[object] = []

    def claim() -> None:
        with db.begin() as session:
            claimed.append(claims.claim_next_job(session, settings, clock()))

    thread = threading.Thread(target=claim)
    thread.start()
    _until_the_claim_pauses(db)
    view = drains.drain(World(settings, db, clock).rt, ["net-a"])
    thread.join()
    # The drain committed while the claim was inside its locking statement; the drain saw no
    # active job. The claim must then find the net drained, not take it.
    assert view.complete
    with db() as session:
        state = session.scalar(select(claims.Job.state).where(claims.Job.id == job_id))
    assert claimed == [None] and state == JobState.QUEUED

"""Drain against a claim on the real PostgreSQL (app/usecases/drains.py): a claim whose
locking statement took its snapshot before the drain's commit, and locks the net after it,
never lands on the drained net; so once `drain` (or `status`) says drained, no job is
claimed there."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from sqlalchemy import exists, func, literal, select, text

from app.usecases import claims, drains
from models import JobState
from tests.integration.test_pg_state import enqueue
from tests.unit.conftest import World

T = TypeVar("T")

pytestmark = pytest.mark.integration

PAUSE_S = 0.6


@pytest.fixture
def db(pg_factory, settings, clock):
    from app.usecases import declared_nets

    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
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


def claim_paused_while(
    db, settings, clock, monkeypatch, meanwhile: Callable[[], T]
) -> tuple[list[object], T]:
    """A claim paused inside its locking statement (`_slow_lock_net`) while `meanwhile` runs
    (a claim made there is not paused); the claim's outcome (its assignment, None, or what
    it raised) and what `meanwhile` answered."""
    lock_net = claims._lock_net
    monkeypatch.setattr(claims, "_lock_net", _slow_lock_net)
    outcome: list[object] = []

    def claim() -> None:
        try:
            with db.begin() as session:
                outcome.append(claims.claim_next_job(session, settings, clock()))
        except Exception as exc:  # what a defect raises out of the claim, for the test
            outcome.append(exc)

    thread = threading.Thread(target=claim)
    thread.start()
    try:
        _until_the_claim_pauses(db)
        monkeypatch.setattr(claims, "_lock_net", lock_net)
        answer = meanwhile()
    finally:
        thread.join()
    return outcome, answer


def test_a_claim_racing_a_drain_never_lands_on_the_net_after_it_says_drained(
    db, settings, clock, monkeypatch
):
    job_id = enqueue(db, settings, clock, "racer", net="net-a")
    claimed, view = claim_paused_while(
        db,
        settings,
        clock,
        monkeypatch,
        lambda: drains.drain(World(settings, db, clock).rt, ["net-a"]),
    )
    # The drain committed while the claim was inside its locking statement; the drain saw no
    # active job. The claim must then find the net drained, not take it.
    assert view.complete
    with db() as session:
        state = session.scalar(select(claims.Job.state).where(claims.Job.id == job_id))
    assert claimed == [None] and state == JobState.QUEUED

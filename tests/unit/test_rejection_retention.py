"""A refused enqueue is kept REJECTED_RETENTION_S (so `GET /jobs/{id}` can say "rejected"),
then dropped by the next refusal; with status callbacks on, one whose `rejected` callback is
not settled yet outlives the retention until it is."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.usecases import enqueue
from models import RejectedRequest

RETENTION_S = 600.0


def _reasons(sqlite_factory) -> list[str]:
    with sqlite_factory() as session:
        return sorted(r.reason for r in session.scalars(select(RejectedRequest)))


def _reject(sqlite_factory, key: str, now, *, callbacks: bool = False) -> RejectedRequest:
    with sqlite_factory.begin() as session:
        return enqueue.record_rejection(
            session, key, f"refused {key}", now, RETENTION_S, callbacks=callbacks
        )


def test_a_rejection_is_kept_for_exactly_the_retention(sqlite_factory, clock):
    start = clock()
    _reject(sqlite_factory, "old", start)
    _reject(sqlite_factory, "at-limit", start + timedelta(seconds=RETENTION_S))
    assert _reasons(sqlite_factory) == ["refused at-limit", "refused old"]  # not older yet
    _reject(sqlite_factory, "later", start + timedelta(seconds=RETENTION_S + 1))
    assert _reasons(sqlite_factory) == ["refused at-limit", "refused later"]


def test_with_callbacks_a_settled_rejection_still_waits_for_the_retention(sqlite_factory, clock):
    start = clock()
    fresh = _reject(sqlite_factory, "fresh", start, callbacks=True)
    with sqlite_factory.begin() as session:
        session.get(RejectedRequest, fresh.id).callback_settled_at = start
    _reject(sqlite_factory, "next", start + timedelta(seconds=1), callbacks=True)
    assert _reasons(sqlite_factory) == ["refused fresh", "refused next"]


def test_with_callbacks_an_unsettled_rejection_outlives_the_retention(sqlite_factory, clock):
    start = clock()
    _reject(sqlite_factory, "undelivered", start, callbacks=True)
    _reject(sqlite_factory, "next", start + timedelta(seconds=RETENTION_S * 2), callbacks=True)
    assert _reasons(sqlite_factory) == ["refused next", "refused undelivered"]


def test_a_huge_reason_is_stored_cut_to_4000_characters(sqlite_factory, clock):
    with sqlite_factory.begin() as session:
        enqueue.record_rejection(session, "k", "x" * 5000, clock(), RETENTION_S)
    assert _reasons(sqlite_factory) == ["x" * 4000]


def test_without_callbacks_named_an_undelivered_rejection_goes_at_the_retention(
    sqlite_factory, clock
):
    """`callbacks` defaults to off: no `rejected` event to wait for, the retention alone."""
    start = clock()
    with sqlite_factory.begin() as session:
        enqueue.record_rejection(session, "old", "refused old", start, RETENTION_S)
    later = start + timedelta(seconds=RETENTION_S + 1)
    with sqlite_factory.begin() as session:
        enqueue.record_rejection(session, "later", "refused later", later, RETENTION_S)
    assert _reasons(sqlite_factory) == ["refused later"]

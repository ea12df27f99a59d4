"""`GET /jobs/{id}` of a refused enqueue answers with the latest refusal of that caller key:
latest by the time the worker recorded it (workers' clocks may disagree with the order the
rows were written in), and among refusals recorded at the same instant, the last written."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import event

from app.schemas import job_id_for
from app.usecases import enqueue
from models import RejectedRequest

RETENTION_S = 3600.0


def test_the_latest_refusal_by_time_wins_over_a_later_written_older_one(sqlite_factory, clock):
    now = clock()
    with sqlite_factory.begin() as session:
        enqueue.record_rejection(session, "key-1", "bundle missing", now, RETENTION_S)
        # Written after, by a worker whose clock is a few seconds behind.
        enqueue.record_rejection(
            session, "key-1", "unknown net", now - timedelta(seconds=5), RETENTION_S
        )
    with sqlite_factory() as session:
        latest = enqueue.get_rejection(session, job_id_for("key-1"))
    assert latest is not None and latest.reason == "bundle missing"


def test_of_refusals_at_the_same_instant_the_last_written_wins(sqlite_factory, clock):
    with sqlite_factory.begin() as session:
        for reason in ("first", "second", "third"):
            enqueue.record_rejection(session, "key-1", reason, clock(), RETENTION_S)
    with sqlite_factory() as session:
        latest = enqueue.get_rejection(session, job_id_for("key-1"))
    assert latest is not None and latest.reason == "third"


def test_the_lookup_loads_only_the_latest_refusal_of_many(sqlite_factory, clock):
    """One row is read, however many refusals the key has kept (`limit(1)`)."""
    with sqlite_factory.begin() as session:
        for reason in ("first", "second", "third"):
            enqueue.record_rejection(session, "key-1", reason, clock(), RETENTION_S)
    loaded: list[str] = []

    def note(target: RejectedRequest, _context: object) -> None:
        loaded.append(target.reason)

    event.listen(RejectedRequest, "load", note)
    try:
        with sqlite_factory() as session:
            enqueue.get_rejection(session, job_id_for("key-1"))
    finally:
        event.remove(RejectedRequest, "load", note)
    assert loaded == ["third"]

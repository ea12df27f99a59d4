"""A refusal expiring while flip-api's repeat of its request is being matched to it, on
PostgreSQL (READ COMMITTED): the repeat's message row (`refused_messages`, a foreign key to
the refusal) must not fail the request (break-it 4 on 0022's refused_messages)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select

from app import names
from app.handlers import HANDLERS, on_error
from app.usecases import enqueue
from models import RefusedMessage, RejectedRequest
from tests.integration.test_refusal_copies_pg import _WAITING, rt

pytestmark = pytest.mark.integration

__all__ = ["rt"]  # the fixture, used by name

M1 = "1a2b3c4d-0000-4e5f-9a10-3b4c5d6e7f81"  # flip-api's first send
M2 = "1a2b3c4d-0000-4e5f-9a10-3b4c5d6e7f82"  # flip-api's own repeat: a new task id


def test_a_repeat_matched_to_a_refusal_another_worker_prunes_is_not_lost(
    rt, pg_factory, settings, clock
):
    """Promise: nothing flip-api sends is lost (a refused request is answered and
    recorded; an IntegrityError fails it for good). Sequence: payload P (key K) was refused
    as M1 almost REJECTED_RETENTION_S ago (row R). flip-api repeats P as M2; worker B
    handles it: its prune (its clock) leaves R, `_same_rejection` reads R, and it adds
    M2's `refused_messages` row pointing at R. Meanwhile worker A refuses another request
    (another key, so another advisory lock) a moment later by its clock: its prune deletes
    R, not committed yet. B's commit inserts M2's row: the foreign key check waits for A's
    delete, A commits, and B fails with a ForeignKeyViolation (IntegrityError: FAILED,
    acknowledged away): M2 answered nothing, recorded nowhere. Before refused_messages the
    repeat only read R."""
    retention = settings.rejected_retention_s
    payload = {"caller_key": "flip-run-prune-1", "definition": "tiny-job", "net": "nope"}
    handler = HANDLERS[names.ENQUEUE_JOB]
    clock.advance(-retention + 5)  # R recorded 5 s inside the retention of B's clock
    assert "rejected" in handler.call(rt, **handler.kwargs({"payload": payload}, M1))
    clock.advance(retention - 5)
    with pg_factory.begin() as session:
        session.execute(
            RejectedRequest.__table__.update().values(callback_settled_at=clock())
        )  # delivered (matters only with callbacks on)

    a = pg_factory()  # worker A, a moment later: R has expired by its clock
    enqueue.record_rejection(
        a,
        "another-key",
        "unknown net 'x'",
        clock() + timedelta(seconds=10),
        retention,
        callbacks=settings.callbacks_enabled,
    )
    outcome: list[object] = []

    def worker_b():
        try:
            outcome.append(handler.call(rt, **handler.kwargs({"payload": payload}, M2)))
        except Exception as exc:
            outcome.append(exc)

    b = threading.Thread(target=worker_b)
    b.start()
    deadline = time.monotonic() + 5
    while b.is_alive() and time.monotonic() < deadline:
        with pg_factory() as session:
            if session.scalar(_WAITING):
                break
        time.sleep(0.02)
    a.commit()
    a.close()
    b.join(10)
    assert outcome
    result = outcome[0]
    if isinstance(result, Exception):
        verdict = on_error(handler, result, 0, settings)
        raise AssertionError(
            f"M2 (flip-api's repeat of a refused payload) raised {type(result).__name__} "
            f"({verdict}): {str(result).splitlines()[0]}"
        )
    assert "rejected" in result
    with pg_factory() as session:
        kept = session.scalars(select(RefusedMessage.message_id)).all()
    assert M2 in kept or kept == []

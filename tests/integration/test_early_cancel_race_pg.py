"""A cancel_prewarm for a key no prewarm has yet and that prewarm, committing at the same time
on PostgreSQL (READ COMMITTED): neither may miss the other (app.usecases.prewarm.early_cancels).
A cancel that looked for the prewarm and kept itself, and a prewarm that looked for a kept
cancel and inserted its row, each missed the other's uncommitted row: the cancel was kept
for nothing and the prewarm held its net to its deadline."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select

from app.schemas import PrewarmNet
from app.usecases import prewarm, requests
from app.usecases.prewarm import early_cancels
from models import EarlyCancel, Prewarm, PrewarmOutcome
from tests.fixtures.pg_waits import run_together, wait_for_a_lock_wait_or, worker_runtime

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(pg_factory, settings, clock):
    """A worker's runtime on PostgreSQL with the nets' rows."""
    return worker_runtime(pg_factory, settings, clock, coalesced=False)


def _hint(key: str) -> dict[str, Any]:
    return {"caller_key": key, "net": "net-a", "within_s": 600}


def _outcome(pg_factory, key: str) -> str | None:
    with pg_factory() as session:
        row = session.scalar(select(Prewarm).where(Prewarm.caller_key == key, ~Prewarm.refused))
        assert row is not None
        outcome: str | None = row.outcome
        return outcome


def _kept(pg_factory) -> list[str]:
    with pg_factory() as session:
        return list(session.scalars(select(EarlyCancel.caller_key)))


def test_a_cancel_while_the_prewarm_is_uncommitted_waits_for_it_and_cancels_the_hold(
    rt, pg_factory, settings, clock
):
    """The prewarm took its key's lock, looked (no cancel kept) and inserted its hold, not
    committed yet; the cancel waits at the lock for that commit, then finds the hold and
    ends it, as any cancel."""
    prewarming = pg_factory()
    row, created, _ = prewarm._accept(prewarming, settings, PrewarmNet(**_hint("k")), clock())
    assert created and row.outcome is None
    answers: list[dict[str, object]] = []
    payload = {"caller_key": "k"}
    cancel = threading.Thread(target=lambda: answers.append(requests.cancel_prewarm(rt, payload)))
    cancel.start()
    wait_for_a_lock_wait_or(cancel, pg_factory)
    prewarming.commit()
    prewarming.close()
    cancel.join(timeout=10)
    assert [a.get("status", a) for a in answers] == ["cancelled"]
    assert _outcome(pg_factory, "k") == PrewarmOutcome.CANCELLED
    assert _kept(pg_factory) == []


def test_a_prewarm_while_the_cancel_is_uncommitted_waits_for_it_and_ends_at_once(
    rt, pg_factory, clock
):
    """The cancel took its key's lock, found no prewarm and kept itself, not committed yet
    (as `prewarm.cancel_prewarm` does in one transaction); the prewarm waits at the lock for
    that commit, then takes the kept cancel: recorded `cancelled`, no warm-up sent."""
    cancelling = pg_factory()
    early_cancels.lock(cancelling, "k")
    assert prewarm._accepted(cancelling, "k") is None
    early_cancels.keep(cancelling, "k", now=clock(), retention_s=rt.settings.rejected_retention_s)
    answers: list[dict[str, object]] = []
    warm = threading.Thread(target=lambda: answers.append(requests.prewarm_net(rt, _hint("k"))))
    warm.start()
    wait_for_a_lock_wait_or(warm, pg_factory)
    cancelling.commit()
    cancelling.close()
    warm.join(timeout=10)
    assert [(a["status"], a["created"]) for a in answers] == [("cancelled", True)]
    assert _outcome(pg_factory, "k") == PrewarmOutcome.CANCELLED
    assert _kept(pg_factory) == []
    assert rt.outbox.sent == []


def test_racing_cancels_and_prewarms_never_leave_a_hold_open_with_a_cancel_kept(rt, pg_factory):
    """Many pairs started together, each in either order: every prewarm ends cancelled, and
    no kept cancel is left for a key that has a prewarm."""
    pairs = 12
    calls: list[Any] = []
    for i in range(pairs):
        key = f"pair-{i}"
        calls += [
            lambda k=key: requests.cancel_prewarm(rt, {"caller_key": k}),
            lambda k=key: requests.prewarm_net(rt, _hint(k)),
        ]
    errors = run_together(calls)
    assert errors == []
    outcomes = {_outcome(pg_factory, f"pair-{i}") for i in range(pairs)}
    assert outcomes == {PrewarmOutcome.CANCELLED}
    assert _kept(pg_factory) == []

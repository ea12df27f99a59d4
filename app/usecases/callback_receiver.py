"""The callback receiver's row: the one deliverer's lease on it, and the one pending wake-up
of the delivery task."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db import unit_of_work
from app.runtime import Runtime
from models import CallbackReceiver

RECEIVER_ID = 1
# A lease outlives the longest request it covers (the sender ends a whole request within
# CALLBACK_TIMEOUT_S) with a wide margin; it is renewed after every request.
LEASE_MARGIN_S = 30.0


def _receiver(session: Session) -> CallbackReceiver:
    """The receiver row, created by whoever needs it first (a concurrent creator wins)."""
    row = session.get(CallbackReceiver, RECEIVER_ID)
    if row is None:
        try:
            with session.begin_nested():
                session.add(CallbackReceiver(id=RECEIVER_ID, failures=0))
        except IntegrityError:
            pass  # another process created it meanwhile
        row = session.get(CallbackReceiver, RECEIVER_ID)
    assert row is not None
    return row


def _lease_s(rt: Runtime) -> float:
    return 4 * rt.settings.callback_timeout_s + LEASE_MARGIN_S


def claim_lease(rt: Runtime, owner: str) -> bool:
    """Become the one deliverer, if nobody holds an unexpired lease (a conditional UPDATE,
    so two workers can never both win)."""
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        _receiver(session)
        claimed = session.execute(
            update(CallbackReceiver)
            .where(
                CallbackReceiver.id == RECEIVER_ID,
                or_(CallbackReceiver.lease_owner.is_(None), CallbackReceiver.lease_until <= now),
            )
            .values(lease_owner=owner, lease_until=now + timedelta(seconds=_lease_s(rt)))
            .execution_options(synchronize_session=False)
        )
        return bool(claimed.rowcount)  # type: ignore[attr-defined]


def release_lease(rt: Runtime, owner: str) -> None:
    """Let the lease go, if `owner` still holds it."""
    with unit_of_work(rt.sessions) as session:
        session.execute(
            update(CallbackReceiver)
            .where(CallbackReceiver.id == RECEIVER_ID, CallbackReceiver.lease_owner == owner)
            .values(lease_owner=None, lease_until=None)
            .execution_options(synchronize_session=False)
        )


def schedule_wake(rt: Runtime, at: datetime) -> float | None:
    """Seconds until the delivery task should run again, if this caller is the one to
    schedule it: at most one wake-up is pending, the earliest needed, so retries never
    multiply however many tasks found work waiting. None: one is already scheduled."""
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        _receiver(session)
        claimed = session.execute(
            update(CallbackReceiver)
            .where(
                CallbackReceiver.id == RECEIVER_ID,
                or_(
                    CallbackReceiver.wake_at.is_(None),
                    CallbackReceiver.wake_at <= now,
                    CallbackReceiver.wake_at > at,
                ),
            )
            .values(wake_at=at)
            .execution_options(synchronize_session=False)
        )
        if not claimed.rowcount:  # type: ignore[attr-defined]
            return None
    return max(0.0, (at - now).total_seconds())


def leased_receiver(
    rt: Runtime, session: Session, owner: str, now: datetime
) -> CallbackReceiver | None:
    """The receiver row with its lease renewed, or None if `owner` no longer holds it."""
    receiver = session.get(CallbackReceiver, RECEIVER_ID, with_for_update=True)
    if receiver is None or receiver.lease_owner != owner:
        return None
    receiver.lease_until = now + timedelta(seconds=_lease_s(rt))
    return receiver

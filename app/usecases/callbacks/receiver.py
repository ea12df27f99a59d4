"""The callback receiver's row: the one deliverer's lease on it, and the one pending wake-up
of the delivery task.

Its statements are built once, here, with bind parameters: they run several times in every
delivery round, and building one and its cache key costs more Python than sending it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import bindparam, or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db import unit_of_work
from app.runtime import Runtime
from models import CallbackReceiver

RECEIVER_ID = 1
# A lease outlives the longest request it covers (the sender ends a whole request within
# CALLBACK_TIMEOUT_S) with a wide margin; it is renewed after every request.
LEASE_MARGIN_S = 30.0

_NO_SYNC = {"synchronize_session": False}
_THIS_ROW = CallbackReceiver.id == RECEIVER_ID
_OWNED = CallbackReceiver.lease_owner == bindparam("owner")

# Take the lease if nobody holds an unexpired one (a conditional UPDATE, so two workers can
# never both win); the receiver's rest comes back with it.
_CLAIM = (
    update(CallbackReceiver)
    .where(
        _THIS_ROW,
        or_(
            CallbackReceiver.lease_owner.is_(None),
            CallbackReceiver.lease_until <= bindparam("now"),
        ),
    )
    .values(lease_owner=bindparam("owner"), lease_until=bindparam("until"))
    .returning(CallbackReceiver.next_attempt_at)
    .execution_options(**_NO_SYNC)
)
_RELEASE = (
    update(CallbackReceiver)
    .where(_THIS_ROW, _OWNED)
    .values(lease_owner=None, lease_until=None)
    .execution_options(**_NO_SYNC)
)
# After an answered try: the lease renewed, the receiver awake (what `_judge` writes on the
# row for any answer), only while `owner` still holds it.
_RENEW_ANSWERED = (
    update(CallbackReceiver)
    .where(_THIS_ROW, _OWNED)
    .values(lease_until=bindparam("until"), failures=0, next_attempt_at=None)
    .execution_options(**_NO_SYNC)
)
# ... or, after the round's last try, the lease let go in the same statement.
_RELEASE_ANSWERED = (
    update(CallbackReceiver)
    .where(_THIS_ROW, _OWNED)
    .values(lease_owner=None, lease_until=None, failures=0, next_attempt_at=None)
    .execution_options(**_NO_SYNC)
)
# One pending wake-up, the earliest needed: set unless one is pending at or before `at`.
_WAKE = (
    update(CallbackReceiver)
    .where(
        _THIS_ROW,
        or_(
            CallbackReceiver.wake_at.is_(None),
            CallbackReceiver.wake_at <= bindparam("now"),
            CallbackReceiver.wake_at > bindparam("at"),
        ),
    )
    .values(wake_at=bindparam("at"))
    .execution_options(**_NO_SYNC)
)


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


@dataclass(frozen=True)
class Lease:
    """The lease, taken: who holds it, and until when the receiver rests (None: awake)."""

    owner: str
    resting_until: datetime | None

    def resting(self, now: datetime) -> bool:
        """Nothing is tried before the receiver's backoff is over."""
        return self.resting_until is not None and self.resting_until > now


def take_lease(rt: Runtime, session: Session, owner: str, now: datetime) -> Lease | None:
    """Become the one deliverer in `session`'s transaction, if nobody holds an unexpired
    lease; None otherwise. One statement while the receiver's row exists (it is created
    once, by the first deliverer)."""
    params = {"owner": owner, "now": now, "until": now + timedelta(seconds=_lease_s(rt))}
    claimed = session.execute(_CLAIM, params).first()
    if claimed is None:
        if session.get(CallbackReceiver, RECEIVER_ID) is not None:
            return None  # held by another deliverer
        _receiver(session)
        claimed = session.execute(_CLAIM, params).first()
        if claimed is None:
            return None  # pragma: no cover (another process created it and claimed first)
    return Lease(owner, claimed.next_attempt_at)


def claim_lease(rt: Runtime, owner: str) -> Lease | None:
    """Become the one deliverer (its own transaction), if nobody holds an unexpired lease."""
    with unit_of_work(rt.sessions) as session:
        return take_lease(rt, session, owner, rt.clock())


def let_go(session: Session, owner: str) -> None:
    """Let the lease go in `session`'s transaction, if `owner` still holds it."""
    session.execute(_RELEASE, {"owner": owner})


def release_lease(rt: Runtime, owner: str) -> None:
    """Let the lease go (its own transaction), if `owner` still holds it."""
    with unit_of_work(rt.sessions) as session:
        let_go(session, owner)


def renew_answered(
    rt: Runtime, session: Session, owner: str, now: datetime, *, let_go: bool = False
) -> bool:
    """After a try the receiver answered: renew the lease (`let_go`: release it, the round's
    last try) and wake the receiver, only while `owner` holds the lease (one statement,
    which also locks the row until the commit, as `leased_receiver` does); False if it no
    longer does."""
    if let_go:
        renewed = session.execute(_RELEASE_ANSWERED, {"owner": owner})
    else:
        until = now + timedelta(seconds=_lease_s(rt))
        renewed = session.execute(_RENEW_ANSWERED, {"owner": owner, "until": until})
    return bool(renewed.rowcount)  # type: ignore[attr-defined]


def schedule_wake(rt: Runtime, at: datetime) -> float | None:
    """Seconds until the delivery task should run again, if this caller is the one to
    schedule it: at most one wake-up is pending, the earliest needed, so retries never
    multiply however many tasks found work waiting. None: one is already scheduled."""
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        claimed = session.execute(_WAKE, {"now": now, "at": at})
        if not claimed.rowcount:  # type: ignore[attr-defined]
            if session.get(CallbackReceiver, RECEIVER_ID) is not None:
                return None
            _receiver(session)  # the first wake-up ever: create the row, then set it
            if not session.execute(_WAKE, {"now": now, "at": at}).rowcount:  # type: ignore[attr-defined]
                return None  # pragma: no cover (another process scheduled one meanwhile)
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

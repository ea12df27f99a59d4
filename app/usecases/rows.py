"""Rows this transaction already holds locked, answered from the session: a use case that
locks a job (or net) and then calls a shared move that locks it again (`finish_job`,
`mark_dispatched`...) reads it once, not twice (issue 37: a cheaper seed). No other
transaction can change a row this one holds locked, so the session's copy is the row; the
memory of what was locked ends with the transaction (committed or rolled back, a savepoint
included: a rolled-back savepoint releases the locks taken inside it)."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

T = TypeVar("T")

_LOCKED = "fl_dispatcher.rows.locked"


def held(session: Session, cls: type[T], key: Any) -> T | None:
    """The row of `cls` with primary key `key` if this transaction has locked it (its
    session copy, pending changes flushed as a query's autoflush would); else None."""
    locked = session.info.get(_LOCKED)
    row = locked.get((cls, key)) if locked else None
    if row is None or row not in session or row in session.deleted:
        return None
    if session.autoflush:
        session.flush()  # what the query it replaces would have flushed first
    return row  # type: ignore[no-any-return]


def note_locked(session: Session, row: object, key: Any) -> None:
    """This transaction now holds `row` (primary key `key`) locked."""
    # Kept by reference: the session's identity map holds its rows weakly, and a row the
    # caller dropped (only its state was wanted) would be gone by the next lookup.
    session.info.setdefault(_LOCKED, {})[(type(row), key)] = row


@event.listens_for(Session, "after_transaction_end")
def _forget(session: Session, _transaction: SessionTransaction) -> None:
    # Any transaction's end, a savepoint's too: a released savepoint's locks would still be
    # held, but forgetting them only costs a read.
    session.info.pop(_LOCKED, None)

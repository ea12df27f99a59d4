"""A cancel that comes before its prewarm (models.early_cancels): kept, then carried out by
the prewarm that comes under its key, in that prewarm's own transaction. SQL only.

flip-api sends `prewarm`, then `cancel_prewarm` for it; the cancel may be handled first (the
prewarm waiting out a database retry, or two workers taking the two messages in the other
order). Found no prewarm, accepted or refused, under its key, the task's cancel keeps
itself until REJECTED_RETENTION_S from now (the next one kept prunes those past theirs);
the prewarm that comes meanwhile is recorded, ended `cancelled` at once: its net is never
started, no warm-up is sent. A refused prewarm spends the kept cancel too (it is the
request the cancel was for, refused: handled in order, the cancel would have found it).

Neither side may miss the other when the two commit at the same time. On SQLite every write
transaction holds the one write lock (BEGIN IMMEDIATE), so each side's look and write are
one step. On PostgreSQL (READ COMMITTED) a cancel that looked for the prewarm, then kept
itself, and a prewarm that looked for a kept cancel, then inserted its row, could each miss
the other's uncommitted row; so both take a transaction-scoped advisory lock on the key
(`lock`), held to their commit, before that look (a prewarm after its look for a repeat of
itself, which needs none): the second waits, then its look, a later statement, reads what
the first committed.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.errors import NotFound
from models import EarlyCancel

log = logging.getLogger(__name__)

# Keyed (this, hashtext(caller_key)): an int4 pair of its own, apart from enqueue's
# rejection lock ("flrj"), the claims' cap lock ("flcp") and the bigint locks of app.beat
# and app.metrics.fold.
_CANCEL_LOCK = 0x666C7063  # "flpc"


class CancelKept(NotFound):
    """No prewarm has the key yet: the cancel is kept for one until `kept_until`."""

    def __init__(self, missing: NotFound, kept_until: datetime) -> None:
        super().__init__(
            f"{missing}; the cancel is kept until {kept_until.isoformat()} for a prewarm "
            "of this key"
        )
        self.kept_until = kept_until


def lock(session: Session, caller_key: str) -> None:
    """Serialise the cancels and the prewarms of one key until this transaction ends
    (PostgreSQL; SQLite's write lock from BEGIN does it already). Taken before either looks."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(_CANCEL_LOCK, func.hashtext(caller_key))))


def keep(session: Session, caller_key: str, *, now: datetime, retention_s: float) -> datetime:
    """Keep a cancel for a key that names no prewarm (the caller holds `lock` and looked),
    until REJECTED_RETENTION_S from now, and drop the kept cancels past theirs. Returns
    until when it is kept: the first one's, for a repeat."""
    session.execute(delete(EarlyCancel).where(EarlyCancel.kept_until < now))
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    until = now + timedelta(seconds=retention_s)
    session.execute(
        insert(EarlyCancel)
        .values(caller_key=caller_key, asked_at=now, kept_until=until)
        .on_conflict_do_nothing(index_elements=[EarlyCancel.caller_key])
    )
    kept = session.scalar(
        select(EarlyCancel.kept_until).where(EarlyCancel.caller_key == caller_key)
    )
    log.info("prewarm cancel kept for a prewarm not stored yet", extra={"caller_key": caller_key})
    return kept if kept is not None else until


def take(session: Session, caller_key: str, now: datetime) -> datetime | None:
    """The prewarm under `caller_key` comes (the caller holds `lock`): the cancel kept for
    it is deleted, and when it was asked returned; None if none was kept, or its time had
    run out (then it is gone all the same)."""
    found = session.execute(
        delete(EarlyCancel)
        .where(EarlyCancel.caller_key == caller_key)
        .returning(EarlyCancel.asked_at, EarlyCancel.kept_until)
    ).first()
    if found is None:
        return None
    asked: datetime = found.asked_at
    until: datetime = found.kept_until
    return asked if until >= now else None

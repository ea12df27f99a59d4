"""Coalesced kicks: the many commits that each want the assigner to run (every enqueue, an
abort, a report, a freed net) send `assign_next_job` once while one is pending, not once
each, so a burst of N enqueues puts O(1) assign rounds on the broker instead of N.

What loses no kick is the order on both sides, with a marker row (`pending_kicks`) in the
SQL database, which every process has whatever the broker:

- a sender commits its work first, then looks at the marker: present and fresh means a
  kick is on its way that has not started reading yet, so it will see this work; absent
  (or stale) means the sender sets it and sends, unless no job waits to be claimed (the
  same read says so): a round would claim nothing, and a job that becomes claimable later
  is committed after this read, so its own sender looks at the marker then;
- the assign round deletes the marker and commits BEFORE it reads the queue, so a job
  committed after that read finds no marker and sends a kick of its own; a round that finds
  no marker and no job waiting to be claimed (most of beat's) ends after that one read;
- an enqueue looks at the marker inside its own transaction instead (`kick_after_commit`),
  share-locked until its commit, so a round's delete waits for the job; a stale marker it
  leaves to its send after the commit (two enqueues writing it under each other's share
  lock deadlocked).

A kick whose message is lost (a broker restart, a worker killed before the round started)
leaves a marker nobody deletes. It holds back other kicks for at most `stale_after`
(`HOUSEKEEPING_INTERVAL_S`), after which the next sender sends again; and beat's own assign
round, every `HOUSEKEEPING_INTERVAL_S` on the housekeeping queue, takes the marker and
assigns whatever waits. So a QUEUED job waits at most one housekeeping interval (plus that
round's own delay) for a lost kick, as it did before kicks were coalesced.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, exists, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from app import names
from app.db import unit_of_work
from app.runtime import Outbox, Runtime
from app.usecases import claims, dispatch, early_aborts, enqueue
from models import PendingKick

log = logging.getLogger(__name__)

# Tasks whose sends are coalesced: they take no arguments and do all the work there is, so
# one pending message does what any number would.
COALESCED = frozenset({names.ASSIGN_NEXT_JOB})


# The marker's time (None: no marker) and whether a claimable job waits, in one read.
_MARKER_AND_WORK = select(
    select(PendingKick.sent_at).where(PendingKick.task == bindparam("task")).scalar_subquery(),
    exists().where(claims.claimable()),
)


# The same read inside the transaction of the work the kick is for (`kick_after_commit`):
# the marker's row share-locked until that commit, so an assign round's delete of it waits
# for the work to be committed and the claim that follows the delete sees it.
_MARKER_HELD_AND_WORK = select(
    select(PendingKick.sent_at)
    .where(PendingKick.task == bindparam("task"))
    .with_for_update(read=True)
    .scalar_subquery(),
    exists().where(claims.claimable()),
)
# An enqueue's: the same, whether an abort waits for the job it created, and whether its
# message was refused before (`EnqueueKick`).
_MARKER_HELD_WORK_AND_ABORT = _MARKER_HELD_AND_WORK.add_columns(
    early_aborts.WAITING, enqueue.REFUSED
)


def mark_pending(session: Session, task: str, now: datetime, stale_before: datetime) -> bool:
    """Whether the caller must send `task`: True if no kick of it was pending (or the
    pending one was sent before `stale_before`, its message presumed lost) and a job waits
    to be claimed; the marker then says one is pending from `now`. Call it after the commit
    of the work the kick is for (`kick_after_commit` decides inside that transaction)."""
    sent_at, waiting = session.execute(_MARKER_AND_WORK, {"task": task}).one()
    return _set_if_due(session, task, sent_at, waiting, now=now, stale_before=stale_before)


def _set_if_due(
    session: Session,
    task: str,
    sent_at: datetime | None,
    waiting: bool,
    *,
    now: datetime,
    stale_before: datetime,
) -> bool:
    """`mark_pending`'s decision on its read of the marker (`sent_at`) and the queue."""
    if sent_at is not None and sent_at >= stale_before:
        return False  # the common case in a burst: a read, no write, no row lock
    if not waiting:
        # No job waits to be claimed: a round now would claim nothing (it claims only
        # claimable QUEUED jobs), and a job that becomes so after this read sends its own
        # kick, as it would after any round's read. A freed net's kick mostly ends here: one
        # read, where it cost the marker's write and a whole empty round (issue 37).
        return False
    # One statement, so two senders that both saw no marker cannot both send: the loser's
    # conflict finds the winner's fresh marker and changes nothing, so returns no row.
    upsert = _MARK[session.get_bind().dialect.name]
    params = {"task": task, "now": now, "stale_before": stale_before}
    return session.execute(upsert, params).first() is not None


def _mark(insert: Any) -> Any:
    now = bindparam("now", type_=PendingKick.sent_at.type)
    return (
        insert(PendingKick)
        .values(task=bindparam("task"), sent_at=now)
        .on_conflict_do_update(
            index_elements=[PendingKick.task],
            set_={"sent_at": now},
            where=PendingKick.sent_at < bindparam("stale_before"),
        )
        .returning(PendingKick.task)
    )


# Built once at import (issue 37): each dialect's upsert, and the marker's removal (no
# PendingKick is ever loaded in a session: nothing to synchronise).
_MARK = {"postgresql": _mark(postgresql.insert), "sqlite": _mark(sqlite.insert)}
_TAKE = (
    delete(PendingKick)
    .where(PendingKick.task == bindparam("task"))
    .execution_options(synchronize_session=False)
)


def take(session: Session, task: str) -> None:
    """The pending kick of `task` is being acted on: later work needs a kick of its own.
    Commit this before reading the work."""
    session.execute(_TAKE, {"task": task})


class CoalescingOutbox:
    """An outbox that sends a COALESCED task only when no kick of it is pending; every other
    send and the pipeline go straight to the outbox it wraps."""

    def __init__(
        self,
        inner: Outbox,
        sessions: sessionmaker[Session],
        clock: Callable[[], datetime],
        stale_after: timedelta,
    ) -> None:
        self.inner = inner
        self.sessions = sessions
        self.clock = clock
        self.stale_after = stale_after

    def send(self, task: str, **kwargs: Any) -> bool:
        """Send `task`, or count on the kick already pending. True if a worker will act (or
        no job waits for one)."""
        if task not in COALESCED or kwargs:
            return self.inner.send(task, **kwargs)
        now = self.clock()
        try:
            with unit_of_work(self.sessions) as session:
                must_send = mark_pending(session, task, now, now - self.stale_after)
        except SQLAlchemyError as exc:
            # Cannot tell whether one is pending: send. A duplicate kick costs one empty
            # round; a missing one would cost the job a housekeeping interval.
            log.warning("kick marker unavailable; sending", extra={"reason": str(exc)})
            return self.inner.send(task, **kwargs)
        if not must_send:
            return True
        return self.send_marked(task)

    def send_marked(self, task: str) -> bool:
        """Send `task`, whose marker a committed transaction set; if the broker refuses it,
        take the marker back so that the next sender tries at once."""
        if self.inner.send(task):
            return True
        # Nothing is on its way: let the next sender try at once rather than after the
        # marker goes stale. (Deleting a newer sender's marker only costs a duplicate.)
        try:
            with unit_of_work(self.sessions) as session:
                take(session, task)
        except SQLAlchemyError as exc:
            log.warning("kick marker not cleared", extra={"reason": str(exc)})
        return False

    def start_pipeline(self, job_id: str, net_name: str, attempt: int) -> bool:
        """Start a claimed job's chain (never coalesced: each is bound to its attempt)."""
        return self.inner.start_pipeline(job_id, net_name, attempt)


def kick_after_commit(
    rt: Runtime, session: Session, task: str, read: tuple[datetime | None, bool] | None = None
) -> Callable[[], bool]:
    """Decide in `session`'s transaction, the one of the work `task` is asked for, whether
    its kick must be sent (a coalesced kick: its marker read share-locked, and set if due,
    in that transaction: one commit where there were two); returns what sends it, to call
    once that transaction has committed (True: a worker will act, or no job waits). `read`:
    the marker and the queue as this transaction already read them (`EnqueueKick`)."""
    outbox = rt.outbox
    if not isinstance(outbox, CoalescingOutbox) or task not in COALESCED:
        return lambda: outbox.send(task)
    now = outbox.clock()
    stale_before = now - outbox.stale_after
    sent_at: datetime | None
    if read is None:
        sent_at, waiting = session.execute(_MARKER_HELD_AND_WORK, {"task": task}).one()
    else:
        sent_at, waiting = read
    if sent_at is not None and sent_at < stale_before:
        # A stale marker (its kick presumed lost) is replaced after the commit, in a
        # transaction of its own (`CoalescingOutbox.send`), not here: every enqueue of a
        # burst holds it share-locked to its commit, and two that both wrote it here each
        # waited for the other's share lock (a deadlock: one enqueue failed). Rare: a
        # marker is stale only once its round is `stale_after` late.
        return lambda: outbox.send(task)
    if not _set_if_due(session, task, sent_at, waiting, now=now, stale_before=stale_before):
        return lambda: True
    return lambda: outbox.send_marked(task)


class EnqueueKick:
    """An enqueue's kick (`kick_after_commit`), whose read of the marker also answers the
    enqueue's questions after it created a job: whether an abort waits for it
    (`enqueue.AbortWaits`), and whether its broker message `message_id` was refused before
    (`refused`: another copy of the message, judged before the definition's upload was
    visible): one statement, as before there were early aborts."""

    def __init__(self, rt: Runtime, task: str, message_id: str | None = None) -> None:
        self.rt = rt
        self.task = task
        self.message_id = enqueue.recordable_message_id(message_id)
        self.read: tuple[datetime | None, bool] | None = None
        self.refused = False

    def abort_waits(self, session: Session, job_id: uuid.UUID, now: datetime) -> bool:
        """Whether an abort waits for the job just created; the marker is read with it."""
        if not isinstance(self.rt.outbox, CoalescingOutbox) or self.task not in COALESCED:
            # No marker to read.
            self.refused = enqueue.refused_before(session, self.message_id)
            return early_aborts.waits(session, job_id, now)
        message = enqueue.recordable_message_id(self.message_id)
        params: dict[str, object] = {"task": self.task, "refused_message": message}
        params |= early_aborts.waiting_params(job_id, now)
        sent_at, waiting, abort, refused = session.execute(
            _MARKER_HELD_WORK_AND_ABORT, params
        ).one()
        self.read = (sent_at, waiting)
        self.refused = bool(refused)
        return bool(abort)

    def after_commit(self, session: Session) -> Callable[[], bool]:
        """`kick_after_commit` on the marker read already, if it was."""
        return kick_after_commit(self.rt, session, self.task, self.read)


def kick_when_ready(rt: Runtime) -> bool:
    """A worker just started (its pool forked): ask for an assign round if a claimable job
    waits (one its start requeued, one stored while no worker ran), so it is not left to
    beat's round up to `HOUSEKEEPING_INTERVAL_S` away. A pending kick's marker does not hold
    it back: the kick it stands for may have died with the worker this one replaces (fetched,
    then lost before its round took the marker), and a start costs one round at most."""
    outbox = CoalescingOutbox(rt.outbox, rt.sessions, rt.clock, stale_after=_EVERY_MARKER)
    return outbox.send(names.ASSIGN_NEXT_JOB)


# A staleness that makes every marker stale, one dated ahead of this clock too (its sender's
# clock ran ahead, or this one stepped back): `now - _EVERY_MARKER` is a century ahead.
_EVERY_MARKER = -timedelta(days=36500)


def coalesce_kicks(rt: Runtime) -> None:
    """Wrap `rt`'s outbox so its kicks are coalesced, stale after one housekeeping interval
    (beat's assign round covers a lost one within that interval anyway)."""
    rt.outbox = CoalescingOutbox(
        rt.outbox,
        rt.sessions,
        rt.clock,
        timedelta(seconds=rt.settings.housekeeping_interval_s),
    )


def assign_round(rt: Runtime) -> list[claims.Assignment]:
    """The assign round a kick (or beat) asks for: take the pending kick, commit, and only
    then claim, so a job committed after the claim's read sends a new kick. With no kick
    pending and no claimable job waiting, one read and nothing more: the claim would find
    no job, and a job committed after this read finds no marker and sends its own kick."""
    task = names.ASSIGN_NEXT_JOB
    with unit_of_work(rt.sessions) as session:
        marker, waiting = session.execute(_MARKER_AND_WORK, {"task": task}).one()
        if marker is not None:
            take(session, task)
    if marker is None and not waiting:
        # Most of beat's rounds (issue 37: 84% of a simulated seed's, each a marker delete
        # that deleted nothing, then the claim's free-net read in a transaction of its own).
        return []
    return dispatch.claim_and_start(rt)

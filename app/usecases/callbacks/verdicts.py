"""What one try of a callback came to, and its record: an answer judged (delivered, retried
after a backoff, given up, or the receiver resting) and written on the row that keeps the
event's delivery state, only while the deliverer still holds the lease."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.adapters.callbacks import Answer
from app.db import unit_of_work
from app.runtime import Runtime
from app.schemas import storable
from app.usecases.callbacks.payloads import Undeliverable, rejected_event_id
from app.usecases.callbacks.receiver import leased_receiver, renew_answered
from models import CallbackCursor, CallbackReceiver, RejectedRequest

log = logging.getLogger(__name__)


BACKOFF_FIRST_S = 2.0
MAX_DOUBLINGS = 40  # 2 s x 2**40 is far past any cap


class Verdict(StrEnum):
    """What one try came to."""

    DELIVERED = "delivered"
    FAILED = "failed"  # rejected CALLBACK_MAX_4XX_TRIES times: given up, the job moves on
    RETRY_LATER = "retry_later"  # this job waits for its backoff
    # No answer, or a 5xx, 408 or 429: the receiver rests unless the one other event tried
    # is answered.
    UNREACHABLE = "unreachable"
    LEASE_LOST = "lease_lost"  # another deliverer took over; it redelivers from the cursor


def retryable(status: int) -> bool:
    """An answer worth trying again as is: the receiver failed, timed out or asked to slow
    down. Any other non-2xx is a rejection of this payload."""
    return status >= 500 or status in (408, 429)


def backoff_s(tries: int, cap_s: float) -> float:
    """Wait after the `tries`-th failure in a row: 2, 4, 8 ... seconds, capped. No jitter:
    there is one deliverer, so there is no herd to spread."""
    # The exponent is clamped before computing: 2.0 * 2**1024 overflows a float, and a
    # receiver that fails for days reaches such counts.
    doublings = min(max(0, tries - 1), MAX_DOUBLINGS)
    return float(min(cap_s, BACKOFF_FIRST_S * 2**doublings))


def _settle(cursor: CallbackCursor, event_id: int) -> None:
    cursor.settled_through = event_id
    cursor.tries = 0
    cursor.rejections = 0
    cursor.next_attempt_at = None


def _delivered_upsert(insert: Any) -> Any:
    """A job's cursor past `event_id`, its tries and backoff cleared, one more delivered:
    what `_settle` and the DELIVERED count write, as one statement (the cursor row created
    with the job's first delivered event)."""
    stmt = insert(CallbackCursor).values(
        job_id=bindparam("cursor_job"),
        settled_through=bindparam("settled"),
        delivered=1,
        failed=0,
        tries=0,
        rejections=0,
        next_attempt_at=None,
        updated_at=bindparam("at"),
    )
    return stmt.on_conflict_do_update(
        index_elements=[CallbackCursor.job_id],
        set_={
            "settled_through": stmt.excluded.settled_through,
            "delivered": CallbackCursor.delivered + 1,
            "tries": 0,
            "rejections": 0,
            "next_attempt_at": None,
            "updated_at": stmt.excluded.updated_at,
        },
    )


# Built once per dialect: the statement every delivered event runs.
_DELIVERED = {
    "postgresql": _delivered_upsert(postgresql.insert),
    "sqlite": _delivered_upsert(sqlite.insert),
}


def _is_rejection(answer: Answer | str | Undeliverable) -> bool:
    """An answer that refuses the payload (a 4xx other than 408/429, or a 3xx)."""
    return isinstance(answer, Answer) and answer.status >= 300 and not retryable(answer.status)


@dataclass(frozen=True)
class _Judged:
    """One try's outcome, for the row that keeps the event's delivery state."""

    verdict: Verdict
    error: str | None = None
    retry_at: datetime | None = None


def _judge(
    rt: Runtime,
    receiver: CallbackReceiver,
    *,
    label: str,
    given_up: str,
    answer: Answer | str | Undeliverable,
    tries: int,
    rejections: int,
    now: datetime,
    extra: dict[str, Any],
    rest: bool,
) -> _Judged:
    """What an answer means (the same rules for every kind of event): `tries` and
    `rejections` count this try; `rest`: the round's try before this one was not delivered
    either, so a failure now rests the receiver (on its row)."""
    settings = rt.settings
    cap = settings.callback_max_backoff_s
    if isinstance(answer, Undeliverable):
        log.error("callback undeliverable", extra={**extra, "reason": answer.problem})
        return _Judged(Verdict.FAILED, storable(f"{label}: undeliverable: {answer.problem}"))
    if isinstance(answer, Answer) and 200 <= answer.status < 300:
        receiver.failures = 0
        receiver.next_attempt_at = None
        log.debug("callback delivered", extra=extra)
        return _Judged(Verdict.DELIVERED)
    if isinstance(answer, str):
        error = storable(answer)  # the receiver's or the network's words: kept on a row
    else:
        # The receiver's own words, escaped: a NUL (UTF-16 sent without its charset, a
        # binary body) cannot be stored in PostgreSQL's text, and the failed record ended
        # every round on this event, so no other job's went out.
        excerpt = storable(answer.excerpt)
        error = f"HTTP {answer.status}" + (f": {excerpt}" if excerpt else "")
    if isinstance(answer, str) or retryable(answer.status):
        # No answer, or one that says "not now" (5xx, 408, 429): the event backs off, and
        # the round tries one other; failing too, the receiver rests. A receiver failing
        # every event (overloaded, its database down) is then not sent every due event of
        # every job each round: each try came back at once, so a round of them held its
        # worker for the whole budget, and rounds followed back to back.
        receiver.last_error = error
        if not rest:
            log.warning(
                "callback not delivered; trying one other", extra={**extra, "reason": error}
            )
            return _Judged(Verdict.UNREACHABLE, f"{label}: {error}")
        receiver.failures += 1  # rests in a row: 2, 4, 8 ... s
        wait = backoff_s(receiver.failures, cap)
        receiver.next_attempt_at = now + timedelta(seconds=wait)
        log.warning(
            "callback receiver unavailable; resting %.0f s",
            wait,
            extra={**extra, "reason": error},
        )
        return _Judged(Verdict.UNREACHABLE, f"{label}: {error}")
    receiver.failures = 0
    receiver.next_attempt_at = None
    error = f"{label}: {error}"
    if rejections >= settings.callback_max_4xx_tries:
        log.error("callback rejected for good", extra={**extra, "reason": error})
        tries_s = settings.callback_max_4xx_tries
        return _Judged(Verdict.FAILED, f"{error} (rejected {tries_s} times: {given_up})")
    log.warning("callback not accepted; retrying", extra={**extra, "reason": error})
    return _Judged(Verdict.RETRY_LATER, error, now + timedelta(seconds=backoff_s(tries, cap)))


def _own_backoff_s(rt: Runtime, tries: int) -> float:
    return backoff_s(tries, rt.settings.callback_max_backoff_s)


def record_job_try(
    rt: Runtime,
    owner: str,
    job_id: uuid.UUID,
    event_id: int,
    *,
    answer: Answer | str | Undeliverable,
    now: datetime,
    last: bool = False,
    rest: bool = False,
) -> Verdict:
    """Record one try of a job event and renew the lease, only while still holding it (a
    deliverer that lost its lease records nothing: the new holder redelivers). `last`: the
    round has nothing more to send, so a delivered event's record lets the lease go too.
    `rest`: the round's try before was not delivered either (see `_judge`)."""
    if isinstance(answer, Answer) and 200 <= answer.status < 300:
        return _record_delivered(rt, owner, job_id, event_id, now, let_go=last)
    with unit_of_work(rt.sessions) as session:
        receiver = leased_receiver(rt, session, owner, now)
        if receiver is None:
            return Verdict.LEASE_LOST
        cursor = session.get(CallbackCursor, job_id)
        if cursor is None:
            cursor = CallbackCursor(
                job_id=job_id, settled_through=0, delivered=0, failed=0, tries=0, rejections=0
            )
            session.add(cursor)
        cursor.tries += 1
        cursor.updated_at = now
        if _is_rejection(answer):
            cursor.rejections += 1
        judged = _judge(
            rt,
            receiver,
            label=f"event {event_id}",
            given_up="given up, the job's next event goes out",
            answer=answer,
            tries=cursor.tries,
            rejections=cursor.rejections,
            now=now,
            extra={"job": str(job_id), "event_id": event_id},
            rest=rest,
        )
        if judged.verdict in (Verdict.DELIVERED, Verdict.FAILED):
            _settle(cursor, event_id)
        if judged.verdict == Verdict.DELIVERED:
            cursor.delivered += 1
        elif judged.verdict == Verdict.FAILED:
            cursor.failed += 1
        elif judged.verdict == Verdict.RETRY_LATER:
            cursor.next_attempt_at = judged.retry_at
        elif judged.verdict == Verdict.UNREACHABLE:
            # The job backs off too, not only the receiver: if only this job's event goes
            # unanswered (a handler that times out on it), the others go first after the rest.
            cursor.next_attempt_at = now + timedelta(seconds=_own_backoff_s(rt, cursor.tries))
        if judged.error is not None:
            cursor.last_error = judged.error
        return judged.verdict


def _record_delivered(
    rt: Runtime, owner: str, job_id: uuid.UUID, event_id: int, now: datetime, *, let_go: bool
) -> Verdict:
    """A job event the receiver accepted: what `record_job_try` writes for a 2xx, in two
    statements (the lease renewed, or let go, with the receiver awake; the cursor moved on)
    instead of reading both rows first; the answer needs no judging but this."""
    with unit_of_work(rt.sessions) as session:
        if not renew_answered(rt, session, owner, now, let_go=let_go):
            return Verdict.LEASE_LOST
        _settle_delivered(session, job_id, event_id, now)
    log.debug("callback delivered", extra={"job": str(job_id), "event_id": event_id})
    return Verdict.DELIVERED


def _settle_delivered(session: Session, job_id: uuid.UUID, event_id: int, now: datetime) -> None:
    upsert = _DELIVERED[session.get_bind().dialect.name]
    session.execute(upsert, {"cursor_job": job_id, "settled": event_id, "at": now})


def record_rejection_try(
    rt: Runtime,
    owner: str,
    rejection_id: int,
    *,
    answer: Answer | str | Undeliverable,
    now: datetime,
    rest: bool = False,
) -> Verdict | None:
    """Record one try of a rejected event on its row, as `record_job_try` does for a job's (None:
    the row is gone)."""
    with unit_of_work(rt.sessions) as session:
        receiver = leased_receiver(rt, session, owner, now)
        if receiver is None:
            return Verdict.LEASE_LOST
        row = session.get(RejectedRequest, rejection_id)
        if row is None:
            return None
        row.callback_tries += 1
        if _is_rejection(answer):
            row.callback_rejections += 1
        event_id = rejected_event_id(rejection_id)
        judged = _judge(
            rt,
            receiver,
            label=f"event {event_id}",
            given_up="given up",
            answer=answer,
            tries=row.callback_tries,
            rejections=row.callback_rejections,
            now=now,
            extra={"caller_key": row.caller_key, "event_id": event_id},
            rest=rest,
        )
        if judged.verdict in (Verdict.DELIVERED, Verdict.FAILED):
            row.callback_settled_at = now
            row.callback_next_attempt_at = None
            row.callback_failed = judged.verdict == Verdict.FAILED
        elif judged.verdict == Verdict.RETRY_LATER:
            row.callback_next_attempt_at = judged.retry_at
        elif judged.verdict == Verdict.UNREACHABLE:
            wait_s = _own_backoff_s(rt, row.callback_tries)
            row.callback_next_attempt_at = now + timedelta(seconds=wait_s)
        if judged.error is not None:
            row.callback_last_error = judged.error
        return judged.verdict

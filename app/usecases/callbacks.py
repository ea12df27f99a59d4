"""Job status pushed to flip-api: every row of a job's history (`job_events`) is POSTed,
signed, to CALLBACK_URL, at least once and in order per job.

- The events are the history itself, written in the transaction of each move; nothing else
  is written when a job moves. A per-job cursor (`callback_cursors`) says how far the
  job's history has been settled, so a lost message, a dead worker or a receiver that is
  down loses nothing: the next delivery starts from the cursor.
- One deliverer at a time (a lease on the `callback_receiver` row) sends one request at a
  time, each job's events in id order, and a job's next event only after its previous one
  was settled: a later event never overtakes an earlier one. A redelivery (a lease taken
  over after a worker died mid-request) repeats the same `event_id`.
- Delivery never blocks the pipeline: it runs in its own task, after the commit, and a
  receiver that does not answer only delays it (backoff on the receiver row, capped by
  CALLBACK_MAX_BACKOFF_S; nothing else is tried until then).
- An answer that is not a success holds only that job back (its own backoff): 5xx, 408 and
  429 are retried for ever; any other (4xx, 3xx) is a rejection, and after
  CALLBACK_MAX_4XX_TRIES rejections the event is failed for good and the job's next event
  goes out. Progress over completeness: a receiver that refuses one payload must not
  withhold every later status of the job (above all its end) for ever; the failure stays
  visible (job detail, metrics, log) and the order of what is delivered is unchanged.
- A refused enqueue (`rejected_requests`, written by `intake.reject_enqueue`) is an event of
  its own, `kind: "rejected"`, with an `event_id` of its own sequence ("rejected-<row id>",
  a string: it can never equal a job event's integer id). It belongs to no job's history:
  its delivery state is on its row, it is sent before the jobs' events of the same round,
  and the same retry and give-up rules hold it back alone, never a job's events.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import event, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import names
from app.adapters.callbacks import (
    Answer,
    CallbackSender,
    HttpCallbackSender,
    ReceiverUnreachable,
    encode_body,
    signed_headers,
)
from app.db import unit_of_work
from app.runtime import Runtime
from models import CallbackCursor, CallbackReceiver, Job, JobEvent, RejectedRequest

log = logging.getLogger(__name__)

RECEIVER_ID = 1
# A delivery task hands its worker back after this long (and is sent again at once), so a
# backlog never holds a worker away from the pipeline for long.
ROUND_BUDGET_S = 60.0
# A lease outlives the longest request it covers (httpx bounds connect, write and read each
# by CALLBACK_TIMEOUT_S) with a margin; it is renewed after every request.
LEASE_MARGIN_S = 30.0
JOBS_PER_READ = 100
EVENTS_PER_READ = 50
REJECTIONS_PER_READ = 50
BACKOFF_FIRST_S = 2.0
MAX_DOUBLINGS = 40  # 2 s x 2**40 is far past any cap
_KICK_WANTED = "fl_dispatcher.callbacks.kick"


class Verdict(StrEnum):
    """What one try came to."""

    DELIVERED = "delivered"
    FAILED = "failed"  # rejected CALLBACK_MAX_4XX_TRIES times: given up, the job moves on
    RETRY_LATER = "retry_later"  # this job waits for its backoff
    UNREACHABLE = "unreachable"  # no answer: nothing is tried until the receiver's backoff
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


# What a payload's `kind` says: a job's move, or an enqueue that created no job.
STATE_CHANGE = "state_change"
REJECTED = "rejected"
REJECTED_EVENT_PREFIX = "rejected-"


def rejected_event_id(rejection_id: int) -> str:
    """A rejected event's id: a string, so it never equals a job event's integer id."""
    return f"{REJECTED_EVENT_PREFIX}{rejection_id}"


def event_payload(job: Job, event: JobEvent) -> dict[str, Any]:
    """The JSON one job event is sent as (README, "Status callbacks")."""
    return {
        "event_id": event.id,
        "kind": STATE_CHANGE,
        "job_id": str(job.id),
        "caller_key": job.caller_key,
        "metadata": job.metadata_ if job.metadata_ is not None else {},
        "from_state": event.from_state.value if event.from_state is not None else None,
        "to_state": event.to_state.value,
        "at": event.at.isoformat(),
        "reason": event.reason,
        "reason_code": event.reason_code,
        "nvflare_job_id": event.nvflare_job_id,
        "attempt": event.attempt,
    }


def rejection_payload(rejection: RejectedRequest) -> dict[str, Any]:
    """The JSON a refused enqueue is sent as: no job was created; `job_id` is the id the
    job would have had (null when the payload carried no caller_key)."""
    return {
        "event_id": rejected_event_id(rejection.id),
        "kind": REJECTED,
        "job_id": str(rejection.job_id) if rejection.job_id is not None else None,
        "caller_key": rejection.caller_key,
        "reason": rejection.reason,
        "reason_code": rejection.reason_code,
        "at": rejection.at.isoformat(),
    }


# --- what is pending -----------------------------------------------------------------------


def _settled() -> Any:
    return func.coalesce(CallbackCursor.settled_through, 0)


def _pending_events() -> Any:
    """job_events not yet settled, joined with their job's cursor (if any)."""
    return (
        select(JobEvent.job_id)
        .select_from(JobEvent)
        .outerjoin(CallbackCursor, CallbackCursor.job_id == JobEvent.job_id)
        .where(JobEvent.id > _settled())
    )


def _unsettled_rejection() -> Any:
    return RejectedRequest.callback_settled_at.is_(None)


def _due_rejections(session: Session, now: datetime) -> list[int]:
    """Rejected events not yet settled whose backoff is over, oldest first."""
    stmt = (
        select(RejectedRequest.id)
        .where(
            _unsettled_rejection(),
            or_(
                RejectedRequest.callback_next_attempt_at.is_(None),
                RejectedRequest.callback_next_attempt_at <= now,
            ),
        )
        .order_by(RejectedRequest.id)
        .limit(REJECTIONS_PER_READ)
    )
    return list(session.scalars(stmt))


def _due_jobs(session: Session, now: datetime) -> list[uuid.UUID]:
    """Jobs with an unsettled event whose backoff is over, oldest head first."""
    stmt = (
        _pending_events()
        .where(or_(CallbackCursor.next_attempt_at.is_(None), CallbackCursor.next_attempt_at <= now))
        .group_by(JobEvent.job_id)
        .order_by(func.min(JobEvent.id))
        .limit(JOBS_PER_READ)
    )
    return list(session.scalars(stmt))


def _next_due(session: Session, now: datetime) -> datetime | None:
    """When anything is next due (`now` if something is due now), None if nothing is
    pending. The receiver's backoff is a floor under every job's."""
    rows = session.execute(
        _pending_events()
        .add_columns(CallbackCursor.next_attempt_at)
        .group_by(JobEvent.job_id, CallbackCursor.next_attempt_at)
    ).all()
    waits: list[datetime | None] = [at for _, at in rows]
    waits += session.scalars(
        select(RejectedRequest.callback_next_attempt_at)
        .where(_unsettled_rejection())
        .group_by(RejectedRequest.callback_next_attempt_at)
    ).all()
    if not waits:
        return None
    due = min(max(now, at) if at is not None else now for at in waits)
    receiver = session.get(CallbackReceiver, RECEIVER_ID)
    if receiver is not None and receiver.next_attempt_at is not None:
        due = max(due, receiver.next_attempt_at)
    return due


@dataclass(frozen=True)
class Backlog:
    """What the metrics say about delivery."""

    undelivered: int
    oldest_undelivered_at: datetime | None
    failed: int


def backlog(session: Session) -> Backlog:
    """Unsettled events (one aggregate over the history, one over the rejected enqueues)
    and events failed for good."""
    count, oldest = session.execute(
        select(func.count(), func.min(JobEvent.at))
        .select_from(JobEvent)
        .outerjoin(CallbackCursor, CallbackCursor.job_id == JobEvent.job_id)
        .where(JobEvent.id > _settled())
    ).one()
    rejected, oldest_rejected = session.execute(
        select(func.count(), func.min(RejectedRequest.at)).where(_unsettled_rejection())
    ).one()
    failed = session.scalar(select(func.coalesce(func.sum(CallbackCursor.failed), 0)))
    failed_rejected = session.scalar(
        select(func.count()).select_from(RejectedRequest).where(RejectedRequest.callback_failed)
    )
    oldest_of = [at for at in (oldest, oldest_rejected) if at is not None]
    return Backlog(
        int(count) + int(rejected),
        min(oldest_of) if oldest_of else None,
        int(failed or 0) + int(failed_rejected or 0),
    )


def delivery_status(session: Session, job_id: uuid.UUID) -> dict[str, Any]:
    """One job's delivery, for its detail view."""
    cursor = session.get(CallbackCursor, job_id)
    settled = cursor.settled_through if cursor is not None else 0
    pending = session.scalar(
        select(func.count())
        .select_from(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.id > settled)
    )
    return {
        "delivered": cursor.delivered if cursor is not None else 0,
        "pending": int(pending or 0),
        "failed": cursor.failed if cursor is not None else 0,
        "last_error": cursor.last_error if cursor is not None else None,
        "next_attempt_at": (
            cursor.next_attempt_at.isoformat()
            if cursor is not None and cursor.next_attempt_at is not None
            else None
        ),
    }


# --- the receiver row: lease and wake-up --------------------------------------------------


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


def _claim_lease(rt: Runtime, owner: str) -> bool:
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


def _release_lease(rt: Runtime, owner: str) -> None:
    with unit_of_work(rt.sessions) as session:
        session.execute(
            update(CallbackReceiver)
            .where(CallbackReceiver.id == RECEIVER_ID, CallbackReceiver.lease_owner == owner)
            .values(lease_owner=None, lease_until=None)
            .execution_options(synchronize_session=False)
        )


def _schedule_wake(rt: Runtime, at: datetime) -> float | None:
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


# --- delivering ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveryReport:
    """What one call delivered, and when the task should run again (None: not needed, or
    another call already scheduled it)."""

    delivered: int = 0
    failed: int = 0
    busy: bool = False  # another deliverer holds the lease; it also sends what is due now
    retry_in_s: float | None = None


@dataclass
class _Round:
    delivered: int = 0
    failed: int = 0
    out_of_time: bool = False
    lease_lost: bool = False


def deliver_callbacks(rt: Runtime, sender: CallbackSender | None = None) -> DeliveryReport:
    """Deliver every due event, each job's in order, one request at a time; returns when
    nothing is due, the receiver does not answer, or the round's time budget is spent.

    Safe to call any number of times from any number of workers: a caller that finds the
    lease held returns at once, and the holder looks again after letting go, so an event
    committed meanwhile is not left to the next sweep."""
    settings = rt.settings
    if settings.callback_url is None:
        return DeliveryReport()
    own_sender = sender is None
    active = sender or HttpCallbackSender(settings.callback_url, settings.callback_timeout_s)
    try:
        return _deliver(rt, active)
    finally:
        if own_sender:
            active.close()


def _deliver(rt: Runtime, sender: CallbackSender) -> DeliveryReport:
    owner = uuid.uuid4().hex
    deadline = time.monotonic() + ROUND_BUDGET_S
    total = _Round()
    while True:
        if not _claim_lease(rt, owner):
            return DeliveryReport(total.delivered, total.failed, busy=True)
        try:
            done = _deliver_due(rt, sender, owner, deadline)
        finally:
            _release_lease(rt, owner)
        total.delivered += done.delivered
        total.failed += done.failed
        if done.out_of_time or done.lease_lost:
            total.out_of_time = done.out_of_time
            break
        # A task kicked by a commit while we held the lease returned at once; what it was
        # sent for may be due now that the lease is free.
        with rt.sessions() as session:
            due = _next_due(session, rt.clock())
        if due is None or due > rt.clock():
            break
    with rt.sessions() as session:
        due = rt.clock() if total.out_of_time else _next_due(session, rt.clock())
    retry_in = _schedule_wake(rt, due) if due is not None else None
    return DeliveryReport(total.delivered, total.failed, retry_in_s=retry_in)


def _deliver_due(rt: Runtime, sender: CallbackSender, owner: str, deadline: float) -> _Round:
    done = _Round()
    while True:
        if time.monotonic() >= deadline:
            done.out_of_time = True
            return done
        now = rt.clock()
        with rt.sessions() as session:
            receiver = session.get(CallbackReceiver, RECEIVER_ID)
            if receiver and receiver.next_attempt_at and receiver.next_attempt_at > now:
                return done  # the receiver is resting; nothing is tried before then
            rejections = _due_rejections(session, now)
            jobs = _due_jobs(session, now)
        if not jobs and not rejections:
            return done
        # Rejected events first: each is one request, and an enqueue refused before a
        # later one with the same caller_key was accepted then usually arrives first.
        steps = [
            functools.partial(_deliver_rejection, rt, sender, owner, rejection_id, done=done)
            for rejection_id in rejections
        ] + [
            functools.partial(_deliver_job, rt, sender, owner, job_id, deadline=deadline, done=done)
            for job_id in jobs
        ]
        unanswered = 0
        for step in steps:
            verdict = step()
            if verdict == Verdict.UNREACHABLE:
                # No answer to one event may be that event's (a handler that hangs on it):
                # one other due event is tried before the receiver is taken for down. If it
                # is answered, the receiver's rest is lifted and only the first job waits
                # (its own backoff); two in a row unanswered, and everything rests.
                unanswered += 1
                if unanswered > 1:
                    return done
                continue
            unanswered = 0
            if verdict == Verdict.LEASE_LOST:
                done.lease_lost = True
                return done
            if done.out_of_time:
                return done
            if time.monotonic() >= deadline:
                done.out_of_time = True
                return done


def _deliver_job(
    rt: Runtime,
    sender: CallbackSender,
    owner: str,
    job_id: uuid.UUID,
    *,
    deadline: float,
    done: _Round,
) -> Verdict | None:
    """Send the job's unsettled events in id order until one is not delivered."""
    with rt.sessions() as session:
        job = session.get(Job, job_id)
        cursor = session.get(CallbackCursor, job_id)
        settled = cursor.settled_through if cursor is not None else 0
        events = session.scalars(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.id > settled)
            .order_by(JobEvent.id)
            .limit(EVENTS_PER_READ)
        ).all()
        if job is None:
            return None
        bodies = [(e.id, _encoded(event_payload, job, e)) for e in events]
    secret = rt.settings.callback_secret.get_secret_value()
    verdict: Verdict | None = None
    for event_id, body in bodies:
        if time.monotonic() >= deadline:
            done.out_of_time = True
            return verdict
        now = rt.clock()
        if isinstance(body, Undeliverable):
            # Poison: no try can ever send it. Failed for good at once (visible on the job,
            # in metrics and the log), so the job's later events and every other job go on.
            verdict = _record(rt, owner, job_id, event_id, answer=body, now=now)
            if verdict == Verdict.FAILED:
                done.failed += 1
                continue
            return verdict
        headers = signed_headers(secret, int(now.timestamp()), body, event_id)
        try:
            answer: Answer | str = sender.post(body, headers)
        except ReceiverUnreachable as exc:
            answer = str(exc)
        verdict = _record(rt, owner, job_id, event_id, answer=answer, now=rt.clock())
        if verdict == Verdict.DELIVERED:
            done.delivered += 1
        elif verdict == Verdict.FAILED:
            done.failed += 1
        else:
            return verdict
    return verdict


def _deliver_rejection(
    rt: Runtime, sender: CallbackSender, owner: str, rejection_id: int, *, done: _Round
) -> Verdict | None:
    """Send one rejected event (None: its row is gone or already settled)."""
    with rt.sessions() as session:
        rejection = session.get(RejectedRequest, rejection_id)
        if rejection is None or rejection.callback_settled_at is not None:
            return None
        body = _encoded(rejection_payload, rejection)
    secret = rt.settings.callback_secret.get_secret_value()
    event_id = rejected_event_id(rejection_id)
    answer: Answer | str | Undeliverable
    if isinstance(body, Undeliverable):
        answer = body
    else:
        headers = signed_headers(secret, int(rt.clock().timestamp()), body, event_id)
        try:
            answer = sender.post(body, headers)
        except ReceiverUnreachable as exc:
            answer = str(exc)
    verdict = _record_rejection(rt, owner, rejection_id, answer=answer, now=rt.clock())
    if verdict == Verdict.DELIVERED:
        done.delivered += 1
    elif verdict == Verdict.FAILED:
        done.failed += 1
    return verdict


@dataclass(frozen=True)
class Undeliverable:
    """An event whose payload cannot be encoded (stored before payloads were checked, or a
    reason no encoder takes): it is failed for good without a try."""

    problem: str


def _encoded(payload_of: Callable[..., dict[str, Any]], *rows: Any) -> bytes | Undeliverable:
    try:
        return encode_body(payload_of(*rows))
    except (UnicodeError, ValueError, TypeError) as exc:
        return Undeliverable(f"payload cannot be encoded: {type(exc).__name__}: {exc}"[:500])


def _settle(cursor: CallbackCursor, event_id: int) -> None:
    cursor.settled_through = event_id
    cursor.tries = 0
    cursor.rejections = 0
    cursor.next_attempt_at = None


def _is_rejection(answer: Answer | str | Undeliverable) -> bool:
    """An answer that refuses the payload (a 4xx other than 408/429, or a 3xx)."""
    return isinstance(answer, Answer) and answer.status >= 300 and not retryable(answer.status)


@dataclass(frozen=True)
class _Judged:
    """One try's outcome, for the row that keeps the event's delivery state."""

    verdict: Verdict
    error: str | None = None
    retry_at: datetime | None = None


def _leased_receiver(
    rt: Runtime, session: Session, owner: str, now: datetime
) -> CallbackReceiver | None:
    """The receiver row with its lease renewed, or None if `owner` no longer holds it."""
    receiver = session.get(CallbackReceiver, RECEIVER_ID, with_for_update=True)
    if receiver is None or receiver.lease_owner != owner:
        return None
    receiver.lease_until = now + timedelta(seconds=_lease_s(rt))
    return receiver


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
) -> _Judged:
    """What an answer means (the same rules for every kind of event): `tries` and
    `rejections` count this try; a silent receiver rests on the receiver row."""
    settings = rt.settings
    cap = settings.callback_max_backoff_s
    if isinstance(answer, Undeliverable):
        log.error("callback undeliverable", extra={**extra, "reason": answer.problem})
        return _Judged(Verdict.FAILED, f"{label}: undeliverable: {answer.problem}")
    if isinstance(answer, str):
        receiver.failures += 1
        wait = backoff_s(receiver.failures, cap)
        receiver.next_attempt_at = now + timedelta(seconds=wait)
        receiver.last_error = answer
        log.warning(
            "callback receiver unreachable; retrying in %.0f s",
            wait,
            extra={**extra, "reason": answer},
        )
        return _Judged(Verdict.UNREACHABLE, f"{label}: {answer}")
    receiver.failures = 0
    receiver.next_attempt_at = None
    if 200 <= answer.status < 300:
        log.debug("callback delivered", extra=extra)
        return _Judged(Verdict.DELIVERED)
    error = f"{label}: HTTP {answer.status}" + (f": {answer.excerpt}" if answer.excerpt else "")
    if not retryable(answer.status) and rejections >= settings.callback_max_4xx_tries:
        log.error("callback rejected for good", extra={**extra, "reason": error})
        tries_s = settings.callback_max_4xx_tries
        return _Judged(Verdict.FAILED, f"{error} (rejected {tries_s} times: {given_up})")
    log.warning("callback not accepted; retrying", extra={**extra, "reason": error})
    return _Judged(Verdict.RETRY_LATER, error, now + timedelta(seconds=backoff_s(tries, cap)))


def _own_backoff_s(rt: Runtime, tries: int) -> float:
    return backoff_s(tries, rt.settings.callback_max_backoff_s)


def _record(
    rt: Runtime,
    owner: str,
    job_id: uuid.UUID,
    event_id: int,
    *,
    answer: Answer | str | Undeliverable,
    now: datetime,
) -> Verdict:
    """Record one try of a job event and renew the lease, only while still holding it (a
    deliverer that lost its lease records nothing: the new holder redelivers)."""
    with unit_of_work(rt.sessions) as session:
        receiver = _leased_receiver(rt, session, owner, now)
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


def _record_rejection(
    rt: Runtime,
    owner: str,
    rejection_id: int,
    *,
    answer: Answer | str | Undeliverable,
    now: datetime,
) -> Verdict | None:
    """Record one try of a rejected event on its row, as `_record` does for a job's (None:
    the row is gone)."""
    with unit_of_work(rt.sessions) as session:
        receiver = _leased_receiver(rt, session, owner, now)
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


# --- the kick after commit ----------------------------------------------------------------


def send_after_commit(rt: Runtime) -> None:
    """After every commit of `rt`'s sessions that wrote job history or a rejected enqueue,
    send the delivery task through the outbox. One listener for every use case, present and
    future, so no move can forget its callback; rolled-back moves send nothing. Install once
    per runtime (`app.celery_app.celery_runtime` does); a lost kick is covered by beat's
    sweep."""

    @event.listens_for(rt.sessions, "after_flush")
    def _note(session: Session, _context: Any) -> None:
        if any(isinstance(obj, JobEvent | RejectedRequest) for obj in session.new):
            session.info[_KICK_WANTED] = True

    @event.listens_for(rt.sessions, "after_commit")
    def _kick(session: Session) -> None:
        # Releasing a SAVEPOINT fires after_commit too; only the outermost commit counts.
        if session.in_nested_transaction():
            return
        if not session.info.pop(_KICK_WANTED, False):
            return
        try:
            rt.outbox.send(names.DELIVER_CALLBACKS)
        except Exception:
            # Raising here would surface from commit() and fail a use case whose move is
            # already stored; a lost kick only delays delivery until beat's sweep.
            log.exception("sending the callback delivery task failed")

    @event.listens_for(rt.sessions, "after_rollback")
    def _forget(session: Session) -> None:
        session.info.pop(_KICK_WANTED, None)

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
"""

from __future__ import annotations

import logging
import time
import uuid
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
from models import CallbackCursor, CallbackReceiver, Job, JobEvent

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
BACKOFF_FIRST_S = 2.0
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
    return float(min(cap_s, BACKOFF_FIRST_S * 2 ** max(0, tries - 1)))


def event_payload(job: Job, event: JobEvent) -> dict[str, Any]:
    """The JSON one event is sent as (README, "Status callbacks")."""
    return {
        "event_id": event.id,
        "job_id": str(job.id),
        "caller_key": job.caller_key,
        "metadata": job.metadata_ if job.metadata_ is not None else {},
        "from_state": event.from_state.value if event.from_state is not None else None,
        "to_state": event.to_state.value,
        "at": event.at.isoformat(),
        "reason": event.reason,
        "nvflare_job_id": event.nvflare_job_id,
        "attempt": event.attempt,
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
    if not rows:
        return None
    due = min(max(now, at) if at is not None else now for _, at in rows)
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
    """Unsettled events (one aggregate over the history) and events failed for good."""
    count, oldest = session.execute(
        select(func.count(), func.min(JobEvent.at))
        .select_from(JobEvent)
        .outerjoin(CallbackCursor, CallbackCursor.job_id == JobEvent.job_id)
        .where(JobEvent.id > _settled())
    ).one()
    failed = session.scalar(select(func.coalesce(func.sum(CallbackCursor.failed), 0)))
    return Backlog(int(count), oldest, int(failed or 0))


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
            jobs = _due_jobs(session, now)
        if not jobs:
            return done
        for job_id in jobs:
            verdict = _deliver_job(rt, sender, owner, job_id, deadline=deadline, done=done)
            if verdict == Verdict.UNREACHABLE:
                return done
            if verdict == Verdict.LEASE_LOST:
                done.lease_lost = True
                return done
            if done.out_of_time:
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
        bodies = [(e.id, encode_body(event_payload(job, e))) for e in events]
    secret = rt.settings.callback_secret.get_secret_value()
    verdict: Verdict | None = None
    for event_id, body in bodies:
        if time.monotonic() >= deadline:
            done.out_of_time = True
            return verdict
        now = rt.clock()
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


def _settle(cursor: CallbackCursor, event_id: int) -> None:
    cursor.settled_through = event_id
    cursor.tries = 0
    cursor.rejections = 0
    cursor.next_attempt_at = None


def _record(
    rt: Runtime,
    owner: str,
    job_id: uuid.UUID,
    event_id: int,
    *,
    answer: Answer | str,
    now: datetime,
) -> Verdict:
    """Record one try's outcome and renew the lease, only while still holding it (a
    deliverer that lost its lease records nothing: the new holder redelivers)."""
    settings = rt.settings
    cap = settings.callback_max_backoff_s
    with unit_of_work(rt.sessions) as session:
        receiver = session.get(CallbackReceiver, RECEIVER_ID, with_for_update=True)
        if receiver is None or receiver.lease_owner != owner:
            return Verdict.LEASE_LOST
        receiver.lease_until = now + timedelta(seconds=_lease_s(rt))
        cursor = session.get(CallbackCursor, job_id)
        if cursor is None:
            cursor = CallbackCursor(
                job_id=job_id, settled_through=0, delivered=0, failed=0, tries=0, rejections=0
            )
            session.add(cursor)
        cursor.tries += 1
        cursor.updated_at = now
        extra = {"job": str(job_id), "event_id": event_id}
        if isinstance(answer, str):
            receiver.failures += 1
            wait = backoff_s(receiver.failures, cap)
            receiver.next_attempt_at = now + timedelta(seconds=wait)
            receiver.last_error = answer
            cursor.last_error = f"event {event_id}: {answer}"
            log.warning(
                "callback receiver unreachable; retrying in %.0f s",
                wait,
                extra={**extra, "reason": answer},
            )
            return Verdict.UNREACHABLE
        receiver.failures = 0
        receiver.next_attempt_at = None
        if 200 <= answer.status < 300:
            _settle(cursor, event_id)
            cursor.delivered += 1
            log.debug("callback delivered", extra=extra)
            return Verdict.DELIVERED
        error = f"event {event_id}: HTTP {answer.status}" + (
            f": {answer.excerpt}" if answer.excerpt else ""
        )
        if not retryable(answer.status):
            cursor.rejections += 1
            if cursor.rejections >= settings.callback_max_4xx_tries:
                _settle(cursor, event_id)
                cursor.failed += 1
                cursor.last_error = (
                    f"{error} (rejected {settings.callback_max_4xx_tries} times: given up, "
                    "the job's next event goes out)"
                )
                log.error("callback rejected for good", extra={**extra, "reason": error})
                return Verdict.FAILED
        cursor.next_attempt_at = now + timedelta(seconds=backoff_s(cursor.tries, cap))
        cursor.last_error = error
        log.warning("callback not accepted; retrying", extra={**extra, "reason": error})
        return Verdict.RETRY_LATER


# --- the kick after commit ----------------------------------------------------------------


def send_after_commit(rt: Runtime) -> None:
    """After every commit of `rt`'s sessions that wrote job history, send the delivery task
    through the outbox. One listener for every use case, present and future, so no move can
    forget its callback; rolled-back moves send nothing. Install once per runtime
    (`app.celery_app.celery_runtime` does); a lost kick is covered by beat's sweep."""

    @event.listens_for(rt.sessions, "after_flush")
    def _note(session: Session, _context: Any) -> None:
        if any(isinstance(obj, JobEvent) for obj in session.new):
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

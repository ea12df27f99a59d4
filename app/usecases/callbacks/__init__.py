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
  receiver that does not answer only delays it. An event with no answer, or a "not now"
  (5xx, 408, 429), backs off alone and one other due event is tried (a job's, after a
  rejected event's silence), read again if the round's read held no other; two in a row
  failing, and the receiver rests (backoff on the receiver row, capped by
  CALLBACK_MAX_BACKOFF_S; nothing else is tried until then). Retried for ever.
- Any other answer that is not a success (4xx, 3xx) is a rejection of that payload: only
  that job waits (its own backoff), and after CALLBACK_MAX_4XX_TRIES rejections the event is
  failed for good and the job's next event goes out. Progress over completeness: a
  receiver that refuses one payload must not withhold every later status of the job (above
  all its end) for ever; the failure stays visible (job detail, metrics, log) and the
  order of what is delivered is unchanged.
- A refused enqueue (`rejected_requests`, written by `intake.record_refusal`) is an event of
  its own, `kind: "rejected"`, with an `event_id` of its own sequence ("rejected-<row id>",
  a string: it can never equal a job event's integer id). It belongs to no job's history:
  its delivery state is on its row, it is sent before the jobs' events of the same round
  (but a job's event is the one tried after its silence), and the same retry and give-up
  rules hold it back alone, never a job's events.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from app import names, traces
from app.adapters.callbacks import (
    Answer,
    CallbackSender,
    HttpCallbackSender,
    ReceiverUnreachable,
    signed_headers,
)
from app.db import unit_of_work
from app.metrics.figures import CALLBACK_FAILED_PRUNED
from app.read_models import CallbackDelivery, iso
from app.runtime import Runtime
from app.usecases.callbacks.due import Batch, JobRef, Look, due_batch, look, settled
from app.usecases.callbacks.payloads import (
    Undeliverable,
    encoded,
    event_payload,
    rejected_event_id,
    rejection_payload,
)
from app.usecases.callbacks.receiver import release_lease, schedule_wake, take_lease
from app.usecases.callbacks.verdicts import Verdict, record_job_try, record_rejection_try
from models import CallbackCursor, JobEvent, MetricTotal, RejectedRequest

log = logging.getLogger(__name__)

# A delivery task hands its worker back after this long (and is sent again at once), so a
# backlog never holds a worker away from the pipeline for long.
ROUND_BUDGET_S = 60.0
_KICK_WANTED = "fl_dispatcher.callbacks.kick"


# --- what the metrics and the job's view say ------------------------------------------------


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
        .where(JobEvent.id > settled())
    ).one()
    rejected, oldest_rejected = session.execute(
        select(func.count(), func.min(RejectedRequest.at)).where(
            RejectedRequest.callback_settled_at.is_(None)
        )
    ).one()
    failed = session.scalar(select(func.coalesce(func.sum(CallbackCursor.failed), 0)))
    # Given-up rejected events kept, and those pruned since (enqueue.record_rejection), in
    # one statement: a prune committed between two reads would count a row twice, and the
    # next scrape's right figure would then read as a counter's fall.
    kept_failed = (
        select(func.count())
        .select_from(RejectedRequest)
        .where(RejectedRequest.callback_failed)
        .scalar_subquery()
    )
    pruned_failed = (
        select(MetricTotal.value)
        .where(MetricTotal.metric == CALLBACK_FAILED_PRUNED, MetricTotal.labels == "")
        .scalar_subquery()
    )
    failed_rejected = session.scalar(select(kept_failed + func.coalesce(pruned_failed, 0)))
    oldest_of = [at for at in (oldest, oldest_rejected) if at is not None]
    return Backlog(
        int(count) + int(rejected),
        min(oldest_of) if oldest_of else None,
        int(failed or 0) + int(failed_rejected or 0),
    )


def delivery_status(session: Session, job_id: uuid.UUID) -> CallbackDelivery:
    """One job's delivery, for its detail view."""
    cursor = session.get(CallbackCursor, job_id)
    settled = cursor.settled_through if cursor is not None else 0
    pending = session.scalar(
        select(func.count())
        .select_from(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.id > settled)
    )
    return CallbackDelivery(
        delivered=cursor.delivered if cursor is not None else 0,
        pending=int(pending or 0),
        failed=cursor.failed if cursor is not None else 0,
        last_error=cursor.last_error if cursor is not None else None,
        next_attempt_at=iso(cursor.next_attempt_at) if cursor is not None else None,
    )


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
    released: bool = False  # the last record let the lease go
    # Tries in a row not delivered (no answer, or 5xx/408/429): the second rests the receiver.
    unanswered: int = 0


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
    deadline = rt.monotonic() + ROUND_BUDGET_S
    total = _Round()
    # A look first, without the lease: a kick or a sweep that finds nothing due (most of
    # them, once a round has sent what several commits kicked for) writes nothing at all.
    with rt.sessions() as session:
        seen = look(session, rt.clock())
    while seen.due_now:
        batch = _claim(rt, owner, seen)
        if batch is None:
            return DeliveryReport(total.delivered, total.failed, busy=True)
        try:
            done = _deliver_due(rt, sender, owner, deadline, batch)
        except BaseException:
            release_lease(rt, owner)
            raise
        # Let go and commit (here, or the last delivered event's record did), and only
        # then look again: a kick that found the lease held returned at once, and what it
        # was sent for must not wait for the sweep. Its event was committed before its
        # claim failed, so before the release committed, so the look sees it; a kick whose
        # claim comes after the commit takes the lease itself. (Looking before the commit
        # would miss an event committed meanwhile whose kick's claim still read the lease
        # as held: PostgreSQL's UPDATE skips a row whose committed version does not match,
        # without waiting for the uncommitted release.)
        if not done.released:
            release_lease(rt, owner)
        with rt.sessions() as session:
            seen = look(session, rt.clock())
        total.delivered += done.delivered
        total.failed += done.failed
        if done.out_of_time or done.lease_lost:
            total.out_of_time = done.out_of_time
            break
    due = rt.clock() if total.out_of_time else seen.due_at
    retry_in = schedule_wake(rt, due) if due is not None else None
    return DeliveryReport(total.delivered, total.failed, retry_in_s=retry_in)


def _claim(rt: Runtime, owner: str, seen: Look) -> Batch | None:
    """Take the lease and read what is due, in one transaction; None if another deliverer
    holds the lease (it looks again when it lets go)."""
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        lease = take_lease(rt, session, owner, now)
        if lease is None:
            return None
        if lease.resting(now):
            return Batch()  # rested since the look: nothing is tried before then
        return due_batch(
            session,
            now,
            jobs=seen.jobs_due,
            rejections=seen.rejections_due,
            events_per_read=rt.settings.callback_events_per_read,
        )


def _deliver_due(
    rt: Runtime, sender: CallbackSender, owner: str, deadline: float, batch: Batch
) -> _Round:
    """Send `batch`, and the next ones while each read comes back full; returns when
    nothing more is due, the receiver does not answer, or the time is spent."""
    done = _Round()
    # No answer to one event may be that event's (a handler that hangs or fails on it): one
    # other due event is tried before the receiver is taken for down. If it is answered,
    # only the first one waits (its own backoff); two in a row unanswered, and everything
    # rests. One failure alone rests nothing: a job whose handler fails with nothing else
    # due, or a round out of time after it, must not hold back a job enqueued next.
    while True:
        rejections = deque(batch.rejections)
        jobs = deque(batch.jobs)
        while rejections or jobs:
            if rt.monotonic() >= deadline:
                done.out_of_time = True
                return done
            # Rejected events first: each is one request, and an enqueue refused before a
            # later one with the same caller_key was accepted then usually arrives first.
            # After a silence, though, the other event tried is a job's: rejected events
            # that hang never hold back the jobs' events.
            if jobs and (done.unanswered or not rejections):
                job, rows = jobs.popleft()
                # Nothing is read after the last job of a batch that was not full: its last
                # event's record may let the lease go itself (one statement and commit fewer).
                last = not (batch.full or jobs or rejections)
                verdict = _deliver_job(
                    rt, sender, owner, job, rows, deadline=deadline, done=done, last=last
                )
            else:
                verdict = _deliver_rejection(rt, sender, owner, rejections.popleft(), done=done)
            if verdict == Verdict.UNREACHABLE:
                done.unanswered += 1
                if done.unanswered > 1:
                    return done
                continue
            done.unanswered = 0
            if verdict == Verdict.LEASE_LOST:
                done.lease_lost = True
                return done
            if done.out_of_time:
                return done
            if rt.monotonic() >= deadline:
                done.out_of_time = True
                return done
        if not (done.unanswered or batch.full):
            # Everything read was sent; what was committed meanwhile is found by the look
            # after letting go.
            return done
        # A full read: more may be due. Or the last event tried went unanswered with nothing
        # left in the read to try (all of it that job's history, say): the one other due
        # event is looked for. The silent one is not read again: its own backoff runs.
        with rt.sessions() as session:
            batch = due_batch(
                session,
                rt.clock(),
                jobs=True,
                rejections=True,
                events_per_read=rt.settings.callback_events_per_read,
            )
        if not (batch.jobs or batch.rejections):
            return done  # nothing else due: after a silence, the receiver rests


def _deliver_job(
    rt: Runtime,
    sender: CallbackSender,
    owner: str,
    job: JobRef,
    rows: list[Any],
    *,
    deadline: float,
    done: _Round,
    last: bool = False,
) -> Verdict | None:
    """Send the job's due events (read in id order) until one is not delivered. `last`: the
    round's last job, whose last event, delivered, lets the lease go with its record."""
    secret, *previous = rt.settings.callback_signing_secrets
    verdict: Verdict | None = None
    for row in rows:
        if rt.monotonic() >= deadline:
            done.out_of_time = True
            return verdict
        now = rt.clock()
        body = encoded(event_payload, job, row)
        if isinstance(body, Undeliverable):
            # Poison: no try can ever send it. Failed for good at once (visible on the job,
            # in metrics and the log), so the job's later events and every other job go on.
            verdict = record_job_try(rt, owner, job.id, row.id, answer=body, now=now)
            if verdict == Verdict.FAILED:
                done.failed += 1
                continue
            return verdict
        headers = signed_headers(secret, int(now.timestamp()), body, row.id, previous)
        started = traces.clock()
        try:
            answer: Answer | str = sender.post(body, headers)
        except ReceiverUnreachable as exc:
            answer = str(exc)
        let_go = last and row is rows[-1]
        verdict = record_job_try(
            rt,
            owner,
            job.id,
            row.id,
            answer=answer,
            now=rt.clock(),
            last=let_go,
            rest=done.unanswered > 0,
        )
        traces.callback(job, row, started, verdict)
        if verdict == Verdict.DELIVERED:
            done.delivered += 1
            done.released = let_go
        elif verdict == Verdict.FAILED:
            done.failed += 1
        else:
            return verdict
    return verdict


def _deliver_rejection(
    rt: Runtime,
    sender: CallbackSender,
    owner: str,
    rejection: RejectedRequest,
    *,
    done: _Round,
) -> Verdict | None:
    """Send one rejected event (None: its row is gone)."""
    body = encoded(rejection_payload, rejection)
    secret, *previous = rt.settings.callback_signing_secrets
    event_id = rejected_event_id(rejection.id)
    answer: Answer | str | Undeliverable
    if isinstance(body, Undeliverable):
        answer = body
    else:
        headers = signed_headers(secret, int(rt.clock().timestamp()), body, event_id, previous)
        try:
            answer = sender.post(body, headers)
        except ReceiverUnreachable as exc:
            answer = str(exc)
    verdict = record_rejection_try(
        rt, owner, rejection.id, answer=answer, now=rt.clock(), rest=done.unanswered > 0
    )
    if verdict == Verdict.DELIVERED:
        done.delivered += 1
    elif verdict == Verdict.FAILED:
        done.failed += 1
    return verdict


# --- the kick after commit ----------------------------------------------------------------


def send_after_commit(rt: Runtime) -> Callable[[], None]:
    """After every commit of `rt`'s sessions that wrote job history or a rejected enqueue,
    send the delivery task through the outbox. One listener for every use case, present and
    future, so no move can forget its callback; rolled-back moves send nothing. Install once
    per runtime (`app.celery_app.celery_runtime` does); a lost kick is covered by beat's
    sweep. Returns what removes the listeners: they hold `rt`, which holds the sessionmaker
    they listen on, so a caller that makes runtimes by the thousand (the simulator, one per
    worker per seed) must remove them, or every runtime stays alive."""

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

    def remove() -> None:
        event.remove(rt.sessions, "after_flush", _note)
        event.remove(rt.sessions, "after_commit", _kick)
        event.remove(rt.sessions, "after_rollback", _forget)

    return remove

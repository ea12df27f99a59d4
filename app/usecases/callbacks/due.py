"""What the callback deliverer reads: whether anything is due and when (one look, taken
without the lease), and the batch it sends once it holds the lease.

The statements are built once, at import, with bind parameters: every delivery round runs
them, and building a statement and its cache key costs more Python than sending it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, bindparam, func, literal, or_, select, union_all
from sqlalchemy.orm import Session

from app.usecases.callbacks.receiver import RECEIVER_ID
from models import CallbackCursor, CallbackReceiver, Job, JobEvent, RejectedRequest

# One read of job events holds at most CALLBACK_EVENTS_PER_READ (the oldest first), one of
# rejected events at most REJECTIONS_PER_READ; a full read is followed by another while the
# lease is held.
REJECTIONS_PER_READ = 50


def settled() -> Any:
    """How far a job's history has been settled (0 without a cursor)."""
    return func.coalesce(CallbackCursor.settled_through, 0)


def pending_events() -> Any:
    """job_events not yet settled, joined with their job's cursor (if any)."""
    return (
        select(JobEvent.job_id)
        .select_from(JobEvent)
        .outerjoin(CallbackCursor, CallbackCursor.job_id == JobEvent.job_id)
        .where(JobEvent.id > settled())
    )


def unsettled_rejection() -> Any:
    """A rejected event not delivered or given up yet."""
    return RejectedRequest.callback_settled_at.is_(None)


_JOBS, _REJECTIONS, _RECEIVER = 1, 2, 3


def _look_statement() -> Any:
    """One row per kind of event: how many are pending, how many of those wait for a
    backoff, and the earliest backoff's end; and the receiver's rest. No `now` in it: what
    is due is worked out from the counts."""
    jobs = pending_events().with_only_columns(
        literal(_JOBS, Integer).label("kind"),
        func.count().label("pending"),
        func.count(CallbackCursor.next_attempt_at).label("waiting"),
        func.min(CallbackCursor.next_attempt_at).label("at"),
    )
    rejected_at = RejectedRequest.callback_next_attempt_at
    rejections = select(
        literal(_REJECTIONS, Integer), func.count(), func.count(rejected_at), func.min(rejected_at)
    ).where(unsettled_rejection())
    receiver = select(
        literal(_RECEIVER, Integer), literal(0, Integer), literal(0, Integer),
        CallbackReceiver.next_attempt_at,
    ).where(CallbackReceiver.id == RECEIVER_ID)  # fmt: skip
    return union_all(jobs, rejections, receiver)


_LOOK = _look_statement()


@dataclass(frozen=True)
class Look:
    """What is pending, as of one read: whether job events and rejected events are due
    now, and when the first thing is (now if something is; None if nothing is pending).
    The receiver's backoff is a floor under every one: while it rests nothing is due."""

    jobs_due: bool = False
    rejections_due: bool = False
    due_at: datetime | None = None

    @property
    def due_now(self) -> bool:
        """Something can be sent now."""
        return self.jobs_due or self.rejections_due


def look(session: Session, now: datetime) -> Look:
    """Whether anything is due now and when the first thing is, in one statement."""
    due: dict[int, datetime] = {}  # by kind: `now`, or when the first backoff ends
    resting_until: datetime | None = None
    for kind, pending, waiting, at in session.execute(_LOOK):
        if kind == _RECEIVER:
            resting_until = at
        elif pending:
            # Due now if one has no backoff running (no cursor, or none set) or it is over.
            due[kind] = now if waiting < pending or at is None or at <= now else at
    if not due:
        return Look()
    due_at = min(due.values())
    if resting_until is not None and resting_until > due_at:
        return Look(due_at=resting_until)  # the receiver rests: nothing is tried before then
    return Look(
        jobs_due=_JOBS in due and due[_JOBS] <= now,
        rejections_due=_REJECTIONS in due and due[_REJECTIONS] <= now,
        due_at=due_at,
    )


# Job events whose job has no backoff running, with what their payload needs of the job
# (`callback_payloads.event_payload`): the jobs whose head was tried and not delivered
# (a handler that hangs on it, a 5xx) after every other, the fewest tries first, then the
# oldest first. A job's events share its cursor, so each job's stay in id order; and hung
# handlers, tried last, can never be each other's "one other due event" while a job the
# receiver answers waits; nor two that fail for ever the two tries of every rest while one
# that failed once waits (the fewest tries first).
_DUE_EVENTS = (
    select(
        JobEvent.id,
        JobEvent.job_id,
        JobEvent.from_state,
        JobEvent.to_state,
        JobEvent.at,
        JobEvent.reason,
        JobEvent.reason_code,
        JobEvent.nvflare_job_id,
        JobEvent.attempt,
        Job.caller_key.label("caller_key"),
        Job.metadata_.label("job_metadata"),
        Job.max_attempts.label("max_attempts"),
        Job.traceparent.label("job_traceparent"),
    )
    .join(Job, Job.id == JobEvent.job_id)
    .outerjoin(CallbackCursor, CallbackCursor.job_id == JobEvent.job_id)
    .where(
        JobEvent.id > settled(),
        or_(
            CallbackCursor.next_attempt_at.is_(None),
            CallbackCursor.next_attempt_at <= bindparam("now"),
        ),
    )
    .order_by(func.coalesce(CallbackCursor.tries, 0), JobEvent.id)
    .limit(bindparam("limit"))
)
# Rejected events not settled whose backoff is over, the fewest tries first (as the jobs'),
# then the oldest first.
_DUE_REJECTIONS = (
    select(RejectedRequest)
    .where(
        unsettled_rejection(),
        or_(
            RejectedRequest.callback_next_attempt_at.is_(None),
            RejectedRequest.callback_next_attempt_at <= bindparam("now"),
        ),
    )
    .order_by(RejectedRequest.callback_tries, RejectedRequest.id)
    .limit(bindparam("limit"))
)


@dataclass(frozen=True)
class JobRef:
    """What a job event's payload needs of its job."""

    id: uuid.UUID
    caller_key: str
    metadata_: dict[str, Any] | None
    max_attempts: int
    traceparent: str | None = None  # the job's trace (app/traces.py)


@dataclass(frozen=True)
class Batch:
    """What one read under the lease found due: rejected events, and each job with its due
    events (rows of JobEvent's columns) in id order, the jobs in the order of their first."""

    rejections: Sequence[RejectedRequest] = ()
    jobs: Sequence[tuple[JobRef, list[Any]]] = ()
    full: bool = False  # a read came back full: more may be due after it


def due_batch(
    session: Session, now: datetime, *, jobs: bool, rejections: bool, events_per_read: int
) -> Batch:
    """What is due now: rejected events if `rejections`, job events if `jobs` (at most
    `events_per_read`; one statement each, read only when the look said so)."""
    rejected = (
        list(session.scalars(_DUE_REJECTIONS, {"now": now, "limit": REJECTIONS_PER_READ}))
        if rejections
        else []
    )
    rows = (
        session.execute(_DUE_EVENTS, {"now": now, "limit": events_per_read}).all() if jobs else []
    )
    by_job: dict[uuid.UUID, tuple[JobRef, list[Any]]] = {}
    for row in rows:
        if row.job_id not in by_job:
            job = JobRef(
                row.job_id, row.caller_key, row.job_metadata, row.max_attempts, row.job_traceparent
            )
            by_job[row.job_id] = (job, [])
        by_job[row.job_id][1].append(row)
    full = len(rejected) >= REJECTIONS_PER_READ or len(rows) >= events_per_read
    return Batch(rejected, list(by_job.values()), full)

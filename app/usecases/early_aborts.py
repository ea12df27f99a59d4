"""An abort that comes before its job (models.early_aborts): kept, then carried out by the
enqueue that creates the job, in that enqueue's own transaction. SQL only, like `records`.

Neither side may miss the other when the two commit at the same time. On SQLite every write
transaction holds the one write lock (BEGIN IMMEDIATE), so the abort's look for the job and
its insert are one step. On PostgreSQL (READ COMMITTED) an abort that stored its row, then
looked for the job, and an enqueue that inserted the job, then looked for the row, could
each miss the other's uncommitted row. So the abort first inserts, then deletes, a
placeholder job under the id (`id_probe`): an enqueue inserting the same id waits at the
primary key for the abort's commit, then reads the kept abort in a later statement; an
abort whose placeholder meets an enqueue in flight waits for it, and finds its job. The
enqueue pays nothing for this: it already inserts the job before its read.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, bindparam, delete, exists, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.schemas import require_storable
from app.usecases import id_probe, records
from models import EarlyAbort, Job, JobState, ReasonCode
from models.reasons import allowed

log = logging.getLogger(__name__)


# Whether an abort still kept waits for a job id (`waiting_params`): a column an enqueue
# reads with its kick's marker, in one statement (app.usecases.kicks.EnqueueKick). Built once.
WAITING: ColumnElement[bool] = exists().where(
    EarlyAbort.job_id == bindparam("early_job"), EarlyAbort.kept_until >= bindparam("early_now")
)
_WAITS = select(WAITING)


def waiting_params(job_id: uuid.UUID, now: datetime) -> dict[str, object]:
    """`WAITING`'s parameters."""
    return {"early_job": job_id, "early_now": now}


def waits(session: Session, job_id: uuid.UUID, now: datetime) -> bool:
    """`WAITING` read on its own (a door whose kicks are not coalesced)."""
    return bool(session.scalar(_WAITS, waiting_params(job_id, now)))


def carry_out(session: Session, job: Job, now: datetime) -> bool:
    """The enqueue that just created `job` found an abort waiting for it: the job is
    aborted as an abort of a QUEUED job is (ABORTED, the abort's reason and code) and the
    kept abort is deleted, in the enqueue's transaction. False if it was gone meanwhile."""
    kept = session.execute(
        delete(EarlyAbort)
        .where(EarlyAbort.job_id == job.id)
        .returning(EarlyAbort.reason, EarlyAbort.reason_code)
    ).first()
    if kept is None:
        return False  # pruned between the read and here: the job stays QUEUED
    reason, code = kept
    # A code this release does not know, or knows only for another end (kept by a newer
    # release, then rolled back), must not fail the enqueue, whose request would be lost
    # (IllegalTransition is acknowledged away): the abort's own code then.
    usable = code in {c.value for c in ReasonCode} and allowed(ReasonCode(code), JobState.ABORTED)
    records.abort_job(
        session, job.id, reason, now, code=ReasonCode(code) if usable else ReasonCode.ABORTED
    )
    log.info("job aborted as it was enqueued", extra={"job": str(job.id), "code": code})
    return True


def keep(
    session: Session,
    job_id: uuid.UUID,
    reason: str,
    code: ReasonCode,
    *,
    now: datetime,
    retention_s: float,
) -> datetime | None:
    """Keep an abort for a job id that names no job, until REJECTED_RETENTION_S from now,
    and drop the kept aborts past theirs. Returns until when the abort is kept (the first
    one's, for a repeat), or None if the job exists after all (an enqueue committed since
    the caller looked): abort it as any job then."""
    require_storable(reason, "reason")
    postgres = session.get_bind().dialect.name == "postgresql"
    # Waits for an enqueue of this id in flight (module docstring); a job found is aborted.
    with id_probe.job_or_hold(session, job_id, now, "early-abort") as job:
        if job is not None:
            return None
        session.execute(delete(EarlyAbort).where(EarlyAbort.kept_until < now))
        insert = postgresql.insert if postgres else sqlite.insert
        until = now + timedelta(seconds=retention_s)
        session.execute(
            insert(EarlyAbort)
            .values(
                job_id=job_id, reason=reason, reason_code=str(code), asked_at=now, kept_until=until
            )
            .on_conflict_do_nothing(index_elements=[EarlyAbort.job_id])
        )
    kept = session.scalar(select(EarlyAbort.kept_until).where(EarlyAbort.job_id == job_id))
    log.info("abort kept for a job not stored yet", extra={"job": str(job_id), "code": str(code)})
    return kept if kept is not None else until

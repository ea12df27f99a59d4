"""A job id read so that an enqueue of that id in flight cannot be missed: what an abort kept
for a job not stored yet (`early_aborts`) and a refused enqueue's record (`intake`) read
before they write. SQL only, like `records`.

On SQLite every write transaction holds the one write lock from its BEGIN (BEGIN IMMEDIATE),
so the read and the writes after it are one step. On PostgreSQL (READ COMMITTED) a read does
not see an enqueue's uncommitted job, and the enqueue's own look (for a kept abort, for its
message's refusal) does not see this transaction's uncommitted row: each could miss the
other. So a placeholder job is inserted under the id first, and deleted before the commit:
an enqueue inserting the same id waits at the primary key for this commit, then reads what
it wrote in a later statement; a placeholder that meets an enqueue in flight waits for it,
and the job is read. The enqueue pays nothing: it inserts its job before its looks anyway.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import ReturningInsert

from models import Job, JobState


# A job row that can never be a caller's: '#' is in no caller_key, no net is named, and it
# is ABORTED, so nothing would claim it even if a reader could see it (none can: it is
# deleted before its transaction commits).
def _placeholder(job_id: uuid.UUID, now: datetime, holder: str) -> ReturningInsert[uuid.UUID]:
    return (
        postgresql.insert(Job)
        .values(
            id=job_id,
            caller_key=f"#{holder}:{job_id}",
            definition="",
            required_sites=[],
            state=JobState.ABORTED,
            max_attempts=1,
            created_at=now,
            state_changed_at=now,
        )
        .on_conflict_do_nothing(index_elements=[Job.id])
        .returning(Job.id)
    )


@contextmanager
def job_or_hold(
    session: Session, job_id: uuid.UUID, now: datetime, holder: str
) -> Iterator[Job | None]:
    """The job stored under `job_id` (committed, or committed by an enqueue this waited
    for), else None with the id held against an enqueue of it until this transaction ends.
    `holder` names the placeholder's writer (its caller_key is `#holder:id`)."""
    if session.get_bind().dialect.name != "postgresql":
        yield session.get(Job, job_id)
        return
    if session.execute(_placeholder(job_id, now, holder)).first() is None:
        yield session.get(Job, job_id, populate_existing=True)  # the enqueue's, committed
        return
    yield None
    # Gone before the commit (an error rolls it back with the rest): no reader ever sees it.
    session.execute(
        delete(Job).where(Job.id == job_id).execution_options(synchronize_session=False)
    )

"""Early aborts: an abort (or flip-api's `stopped` report) for a job id no job has yet.

flip-api knows a job's id before the dispatcher stores the job (`uuid5` of its caller_key),
so it may send `abort_job` right after `enqueue_job`, and the abort may be handled first (the
enqueue's message waiting out a database retry, or two workers taking the two messages in
the other order). The abort is kept here, for as long as a refused request is kept
(REJECTED_RETENTION_S); the enqueue that creates the job then aborts it in its own
transaction and deletes the row (app.usecases.early_aborts).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime


class EarlyAbort(Base):
    """One abort waiting for its job: the first one asked wins, as on a stored job."""

    __tablename__ = "early_aborts"

    # No foreign key: the job does not exist yet, and may never (a caller's typo).
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    # The end's models.reasons.ReasonCode: `aborted` (abort_job) or `reported_stopped`.
    reason_code: Mapped[str] = mapped_column(String(40))
    asked_at: Mapped[datetime] = mapped_column(UTCDateTime())
    kept_until: Mapped[datetime] = mapped_column(UTCDateTime())

"""Early cancels: a `cancel_prewarm` for a prewarm caller_key no prewarm has yet.

flip-api sends a prewarm, then its cancel (the job will not come after all), and the cancel
may be handled first (the prewarm's message waiting out a database retry, or two workers
taking the two messages in the other order). The cancel is kept here, for as long as a
refused request is kept (REJECTED_RETENTION_S); the prewarm that comes under the key then is
recorded ended `cancelled` in its own transaction, never starting its net, and deletes the
row (app.usecases.prewarm.early_cancels). Prewarm keys are their own namespace, apart from
the jobs' (early_aborts): a job and a prewarm may share a key string.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime


class EarlyCancel(Base):
    """One cancel waiting for its prewarm: the first one asked is kept, a repeat changes
    nothing."""

    __tablename__ = "early_cancels"

    # The prewarm's caller_key (prewarms.caller_key); no foreign key: no prewarm has it yet,
    # and none may ever come (a caller's typo, a prewarm never sent).
    caller_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    asked_at: Mapped[datetime] = mapped_column(UTCDateTime())
    kept_until: Mapped[datetime] = mapped_column(UTCDateTime())

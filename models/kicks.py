"""Coalesced kicks (app.kicks): which follow-up task is already on its way to a worker.

A row means "a kick of this task was sent at `sent_at` and no worker has taken it yet"; no
row means none is pending. The taker deletes the row before it reads the work, so anything
committed after that read sends a kick of its own.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime


class PendingKick(Base):
    """One pending kick per task name (e.g. the assigner's)."""

    __tablename__ = "pending_kicks"

    task: Mapped[str] = mapped_column(String(200), primary_key=True)
    sent_at: Mapped[datetime] = mapped_column(UTCDateTime())

"""When each beat loop last finished a round (the housekeeping heartbeat alerts read)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime


class HousekeepingRun(Base):
    """When a beat loop last finished a round. Only beat sends those rounds and only a
    worker runs them, so an old time here means beat, every worker or the broker is down
    (fl_dispatcher_housekeeping_last_run_timestamp_seconds; the alert that reads it)."""

    __tablename__ = "housekeeping_runs"

    loop: Mapped[str] = mapped_column(String(64), primary_key=True)
    finished_at: Mapped[datetime] = mapped_column(UTCDateTime())

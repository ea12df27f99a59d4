"""The running totals of app.metrics: counters and histogram buckets, and what each net's
history left for the next fold (its uptime so far and the clocks of a cold start)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime


class MetricTotal(Base):
    """A running total of app.metrics: a counter, a histogram bucket or a histogram's sum
    (microseconds), kept up to date by folding the history rows written since the last
    scrape (see app.metrics)."""

    __tablename__ = "metric_totals"

    metric: Mapped[str] = mapped_column(String(64), primary_key=True)
    # "" for a plain counter; a bucket's upper bound; a JSON list of label values.
    labels: Mapped[str] = mapped_column(String(512), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class MetricNetClock(Base):
    """What app.metrics keeps of one net's history between scrapes: its uptime so far, since
    when it is out of STOPPED, and when it last entered STARTING (the next cold start)."""

    __tablename__ = "metric_net_clocks"

    net_name: Mapped[str] = mapped_column(
        ForeignKey("nets.name", ondelete="CASCADE"), primary_key=True
    )
    starting_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    up_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    uptime_us: Mapped[int] = mapped_column(BigInteger)

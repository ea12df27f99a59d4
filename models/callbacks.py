"""Delivery state of the job status callbacks (app.usecases.callbacks).

The events themselves are the job's history (`job_events`): a callback is one history row
sent to flip-api. These tables only say how far each job's history has been sent and who
may send next, so an event is never written twice and never lost with a message.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime

_EventRef = BigInteger().with_variant(Integer(), "sqlite")


class CallbackCursor(Base):
    """How far one job's history has been delivered: every event of the job with an id up
    to `settled_through` is settled (delivered, or failed for good); the next one is the
    job's head, tried `tries` times so far. Created at the job's first delivery attempt."""

    __tablename__ = "callback_cursors"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    settled_through: Mapped[int] = mapped_column(_EventRef, server_default=text("0"))
    delivered: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    failed: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # Tries of the head event (any outcome), and how many of them the receiver rejected
    # (a 4xx other than 408/429): CALLBACK_MAX_4XX_TRIES rejections fail the event for good.
    tries: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    rejections: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # The head is not tried before this (backoff after an answer that was not a success).
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class CallbackReceiver(Base):
    """The one receiver (CALLBACK_URL) as the deliverers share it, in one row (id 1).

    `lease_owner` / `lease_until`: the one deliverer that may send now. Deliveries are
    strictly one at a time, which is what keeps each job's events in order at the receiver
    whatever the number of workers. `failures` / `next_attempt_at`: two tries in a row were
    not delivered (no answer, or a 5xx, 408 or 429), so nobody tries before then; `failures`
    counts such rests in a row (each twice the last, capped). `wake_at`: the one scheduled
    retry of the delivery task, so retries never multiply while the receiver is down.
    """

    __tablename__ = "callback_receiver"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    lease_owner: Mapped[str | None] = mapped_column(String(36), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    failures: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    wake_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)

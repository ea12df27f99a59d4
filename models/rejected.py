"""Refused enqueues: a request the worker refused, kept for REJECTED_RETENTION_S so a caller can
tell "rejected" from "not processed yet", and, with CALLBACK_URL set, the `rejected` event
flip-api is sent for it (app.usecases.enqueue.record_rejection, app.usecases.callbacks)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text, Uuid, false, text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime
from models.columns import EVENT_ID


class RejectedRequest(Base):
    """An enqueue the worker refused (bad payload, unknown net, missing bundle...), kept for
    a while so a caller can tell "rejected" from "not processed yet"."""

    __tablename__ = "rejected_requests"

    id: Mapped[int] = mapped_column(EVENT_ID, primary_key=True, autoincrement=True)
    # The id the job would have had (derived from caller_key), or None if no key was given.
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, nullable=True, index=True)
    caller_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    reason: Mapped[str] = mapped_column(Text)
    # models.reasons.ReasonCode: `rejected`, or `caller_key_conflict` (the key names a job
    # enqueued with another payload).
    reason_code: Mapped[str] = mapped_column(String(40), server_default=text("'rejected'"))
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    # sha256 of the payload as sent (`enqueue.payload_digest`): flip-api's own repeat of it
    # (another message) is this refusal; another payload under the key is another request.
    # None: recorded without it (before migration 0022), matched by code and reason.
    payload_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Delivery of its `rejected` status callback (app.usecases.callbacks), as a job's cursor
    # keeps it for the job's events: settled once delivered or given up (`callback_failed`);
    # with CALLBACK_URL set an unsettled row outlives REJECTED_RETENTION_S (at least once).
    callback_settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    callback_failed: Mapped[bool] = mapped_column(Boolean, server_default=false())
    callback_tries: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    callback_rejections: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    callback_next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    callback_last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class RefusedMessage(Base):
    """A broker message (Celery's task id, the same for every copy of it: retries,
    redeliveries, a duplicate of its publish) answered with a refusal: no copy of it ever
    creates a job or a second refusal (app.usecases.enqueue.REFUSED). Every message a
    refusal answered has its row, flip-api's repeat matched to an earlier refusal too; they
    go with the refusal when it is pruned."""

    __tablename__ = "refused_messages"

    message_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    rejection_id: Mapped[int] = mapped_column(
        EVENT_ID, ForeignKey("rejected_requests.id", ondelete="CASCADE"), index=True
    )

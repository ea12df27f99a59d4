"""Prewarms: flip-api's hint that a job for a net is likely within some seconds.

A row is a hold on a net's server: until `hold_until` the idle scale-down leaves that
server up, and once the hold ends (its time runs out, it is cancelled, or a job takes the
net) the net's normal idle grace starts. The deadline is a column, never a timer in a
process, so a lost message or a dead worker cannot make a hold outlive it.

A refused prewarm is a row too (`refused`, with its `outcome` saying why), so a caller who
sent the task can look the refusal up; it takes no key: a corrected repeat is a new request.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    Uuid,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime

# SQLite only auto-increments an INTEGER PRIMARY KEY.
_Id = BigInteger().with_variant(Integer(), "sqlite")


class PrewarmOutcome(StrEnum):
    """How a prewarm ended, or why it was refused (then nothing was started)."""

    USED = "used"  # a job was claimed onto its net while it held
    EXPIRED = "expired"  # its time ran out without a job
    CANCELLED = "cancelled"
    FAILED = "failed"  # its server could not be brought up (deadline, misconfiguration)
    # Refusals: the prewarm held nothing and takes no caller key.
    REJECTED = "rejected"  # bad input: unknown net, sites no net has...
    CALLER_KEY_CONFLICT = "caller_key_conflict"  # the key names a prewarm asked otherwise
    NET_MISCONFIGURED = "net_misconfigured"  # its net needs an operator first
    NET_DRAINED = "net_drained"  # its net (every fitting net) is drained: try after undrain


REFUSALS: frozenset[PrewarmOutcome] = frozenset(
    {
        PrewarmOutcome.REJECTED,
        PrewarmOutcome.CALLER_KEY_CONFLICT,
        PrewarmOutcome.NET_MISCONFIGURED,
        PrewarmOutcome.NET_DRAINED,
    }
)


class Prewarm(Base):
    """One prewarm: the net it holds, until when, and how it ended."""

    __tablename__ = "prewarms"
    __table_args__ = (
        # Idempotent per caller key: one accepted prewarm per key (refusals take none).
        Index(
            "uq_prewarms_caller_key_accepted",
            "caller_key",
            unique=True,
            postgresql_where=text("NOT refused"),
            sqlite_where=text("refused = 0"),
        ),
        # A refused one is looked up by its key too (GET says "refused: why").
        Index("ix_prewarms_caller_key", "caller_key"),
        # The holds on one net since it went idle (the idle check), and the live ones.
        Index("ix_prewarms_net_name_hold_until", "net_name", "hold_until"),
        Index(
            "ix_prewarms_open",
            "hold_until",
            postgresql_where=text("outcome IS NULL"),
            sqlite_where=text("outcome IS NULL"),
        ),
        # Ended prewarms app.metrics has not folded into its counter yet.
        Index(
            "ix_prewarms_uncounted",
            "id",
            postgresql_where=text("outcome IS NOT NULL AND NOT counted"),
            sqlite_where=text("outcome IS NOT NULL AND counted = 0"),
        ),
    )

    id: Mapped[int] = mapped_column(_Id, primary_key=True, autoincrement=True)
    caller_key: Mapped[str] = mapped_column(String(200))
    # app.schemas.PrewarmNet.digest() of the accepted request (defaults filled in): a repeat
    # with another payload is a conflict. NULL on refusals.
    request_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # PrewarmNet.sent_digest(): the request as sent, an omitted field left out (migration 0015).
    sent_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The net it holds (a request for sites is resolved to one); NULL when refused before
    # any net was found.
    net_name: Mapped[str | None] = mapped_column(
        ForeignKey("nets.name", ondelete="CASCADE"), nullable=True
    )
    # The sites the coming job needs: the server is ready once they are connected.
    required_sites: Mapped[list[str]] = mapped_column(JSON)
    within_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # as asked
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # created_at + min(within_s, PREWARM_MAX_S): past it the hold is over, whatever else
    # happened (a refusal's is its created_at: it never held).
    hold_until: Mapped[datetime] = mapped_column(UTCDateTime())
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Set with `outcome`; a hold ends at min(ended_at, hold_until). NULL: still open (a row
    # past hold_until not yet settled has expired all the same).
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(40), nullable=True)
    refused: Mapped[bool] = mapped_column(Boolean, server_default=false())
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, nullable=True)  # the job that used it
    detail: Mapped[str] = mapped_column(Text, server_default=text("''"))
    # Folded into app.metrics' running totals yet (once it has an outcome)?
    counted: Mapped[bool] = mapped_column(Boolean, server_default=false())

"""Drains (issue 40): nets an operator has taken out of the rotation before a redeploy.

A row drains the net it names, or, with `scope` "*", the whole deployment: every net,
those added to NETS later included. A drained net takes no new claim and no prewarm; what
it runs finishes, and its server scales to zero after its idle grace as usual. Queued jobs
wait. The rows are the only record, so a drain survives a restart of every process; an
undrain deletes them.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime

# The scope of a whole-deployment drain: no net's name (a net's name is DNS-like).
ALL_NETS = "*"


class Drain(Base):
    """One drain: of one net (its name) or of every net (`ALL_NETS`)."""

    __tablename__ = "drains"

    # No foreign key: "*" names no row, and a drain of a net is kept while NETS lacks it.
    scope: Mapped[str] = mapped_column(String(63), primary_key=True)
    drained_at: Mapped[datetime] = mapped_column(UTCDateTime())
    reason: Mapped[str] = mapped_column(Text, server_default=text("''"))

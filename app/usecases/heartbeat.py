"""When beat's loops last finished a round (housekeeping_runs): the one sign that beat,
a worker and the broker all work while nothing else happens, read by /metrics."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from models import HousekeepingRun

RECONCILE = "reconcile"


def record_run(session: Session, loop: str, now: datetime) -> None:
    """`loop` finished a round at `now` (an upsert: two rounds at once both land)."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(HousekeepingRun).values(loop=loop, finished_at=now)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["loop"], set_={"finished_at": stmt.excluded.finished_at}
        )
    )

"""When beat's loops last finished a round (housekeeping_runs): the one sign that beat,
a worker and the broker all work while nothing else happens, read by /metrics."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from models import HousekeepingRun

RECONCILE = "reconcile"


def record_run(session: Session, loop: str, now: datetime) -> None:
    """`loop` finished a round at `now` (an upsert: two rounds at once both land)."""
    session.execute(_UPSERTS[session.get_bind().dialect.name], {"loop": loop, "at": now})


def _upsert(insert: Any) -> Any:
    stmt = insert(HousekeepingRun).values(loop=bindparam("loop"), finished_at=bindparam("at"))
    return stmt.on_conflict_do_update(
        index_elements=["loop"], set_={"finished_at": stmt.excluded.finished_at}
    )


# Built once at import, not per round (issue 37): each dialect's own upsert.
_UPSERTS = {"postgresql": _upsert(postgresql.insert), "sqlite": _upsert(sqlite.insert)}

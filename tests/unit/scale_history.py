"""Reading a net's scale history in tests: every scale decision is recorded with why."""

from __future__ import annotations

from sqlalchemy import select

from models import ScaleEvent


def scale_decisions(world, net: str) -> list[tuple[int, str]]:
    """(replicas asked for, why) of every scale decision on `net`, oldest first."""
    with world.rt.sessions() as session:
        events = session.scalars(
            select(ScaleEvent).where(ScaleEvent.net_name == net).order_by(ScaleEvent.id)
        ).all()
        return [(e.replicas, e.reason) for e in events]

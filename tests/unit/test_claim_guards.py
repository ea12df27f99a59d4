"""Which nets a QUEUED job wants: only claimable jobs pin a net."""

from __future__ import annotations

from sqlalchemy import select

from app.usecases import claims
from models import Net


def _wanted(world) -> set[str]:
    with world.rt.sessions() as session:
        return set(session.scalars(select(Net.name).where(claims.wanted_by_queued_job(Net.name))))


def test_a_net_pinned_only_by_finished_jobs_is_not_wanted(world):
    """A job that ran on net-a and ended leaves net-a wanted by nobody."""
    job_id = world.enqueue("done", net="net-a")
    world.run_pipeline(job_id)
    world.abort(job_id)
    assert _wanted(world) == set()


def test_a_queued_pinned_job_wants_its_net_only(world):
    """A QUEUED job pinned to net-a wants net-a and not the other net."""
    world.enqueue("pinned", net="net-a")
    assert _wanted(world) == {"net-a"}

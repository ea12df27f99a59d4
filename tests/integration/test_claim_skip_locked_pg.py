"""A claim on the real PostgreSQL passes over a net another transaction holds locked (FOR
UPDATE SKIP LOCKED: a concurrent claimer's, or scale-down's) and takes the next free net for
its job, rather than ending its claim there (app/usecases/claims.py, `net is None`)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.usecases import claims, declared_nets
from models import Net
from tests.integration.test_pg_state import enqueue

pytestmark = pytest.mark.integration


def test_a_net_another_transaction_holds_locked_is_passed_over_for_the_next(
    pg_factory, settings, clock
):
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    job_id = enqueue(pg_factory, settings, clock, "j")  # unpinned: either net may take it
    with pg_factory.begin() as holder:
        holder.execute(select(Net).where(Net.name == "net-a").with_for_update())
        with pg_factory.begin() as session:
            claimed = claims.claim_next_job(session, settings, clock())
    assert claimed is not None
    assert (claimed.net_name, claimed.job_id) == ("net-b", job_id)

"""Round 13's queue_places on PostgreSQL: a batch of queued jobs' places equal their one-by-one
answers and the claims run then (tests/unit/batch_world.py)."""

from __future__ import annotations

import pytest

from tests.unit.batch_world import run, settings_of

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sites", [False, True])
@pytest.mark.parametrize("seed", [0, 3])
def test_the_batch_answers_as_one_by_one_and_as_the_claims_do(
    pg_factory, tmp_path, job_root, clock, seed, sites
):
    """Held on round 13's queue_places (jobs pinned or not, drains, strays, caps, sites)."""
    settings = settings_of(tmp_path, job_root, seed, sites=sites)
    assert run(pg_factory, settings, clock, seed) == []

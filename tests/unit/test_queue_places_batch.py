"""Break attempts on `queue_places` (a batch of QUEUED jobs' places and reasons, round 13):
the one-job answer (`queue_place`, GET /jobs/{id}) must equal the batch's for that job, and
both must read the nets as before the batch (a declared net without a row yet is no net of
the job's: tests/integration/test_queue_place_pg.py's reading, `n in self.known`)."""

from __future__ import annotations

import json

import pytest

from app.schemas import job_id_for
from app.settings import Settings
from app.usecases.views import job_detail
from tests.fixtures.db import net_decl
from tests.unit.batch_world import run, settings_of
from tests.unit.test_fair_share import enqueue, fair_world


def test_a_declared_net_without_a_row_yet_is_no_net_of_the_job(
    tmp_path, job_root, sqlite_factory, clock
):
    world = fair_world(tmp_path, job_root, sqlite_factory, clock, ["net-1"])
    enqueue(world, "waiting")
    # The API of a deploy that added net-2: its row is created by the next enqueue, worker
    # start or reconcile, not by a GET.
    added = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, n, "ecs") for n in ("net-1", "net-2")]),
        PER_JOB_FL_SERVER="true",
    )
    with world.rt.sessions() as session:
        view = job_detail(session, job_id_for("waiting"), settings=added, now=world.clock())
    assert (view.place_in_line, view.waiting_reason) == (1, "claim pending")


@pytest.mark.parametrize("sites", [False, True])
@pytest.mark.parametrize("seed", [0, 3])
def test_the_batch_answers_as_one_by_one_and_as_the_claims_do(
    sqlite_factory, tmp_path, job_root, clock, seed, sites
):
    """Held on round 13's queue_places (SQLite; PostgreSQL: test_queue_places_batch_pg)."""
    settings = settings_of(tmp_path, job_root, seed, sites=sites)
    assert run(sqlite_factory, settings, clock, seed) == []

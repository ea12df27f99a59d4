"""The claim's fair share on the real PostgreSQL (issue 40, app/usecases/fair_share.py): a
project's usage, the nets it holds divided by its weight, is a float8 there, which raises on
overflow where SQLite gives infinity."""

from __future__ import annotations

import json

import pytest

from app.errors import SettingsError
from app.schemas import job_id_for
from app.settings import Settings
from app.usecases import claims, declared_nets, records
from app.usecases.queue_place import queue_place
from models import Job
from tests.fixtures.db import net_decl
from tests.integration.test_pg_state import enqueue

pytestmark = pytest.mark.integration


def shares_of(tmp_path, job_root, weight: float) -> Settings:
    nets = [net_decl(tmp_path, "net-a"), net_decl(tmp_path, "net-b")]
    return Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps(nets),
        PROJECT_SHARES=json.dumps({"p": {"weight": weight}}),
    )


@pytest.mark.parametrize("weight", [1e-320, 1e-6])
def test_a_tiny_weight_is_refused_or_claims(pg_factory, tmp_path, job_root, clock, weight):
    """A weight the settings accept, however small, never makes the claim fail: 1e-320 (above
    0, as PROJECT_SHARES asks) made a project holding one net use 1/1e-320, out of float8's
    range, and every claim raised 'value out of range: overflow' (no job claimed again)."""
    try:
        settings = shares_of(tmp_path, job_root, weight)
    except SettingsError as exc:
        assert "weight" in str(exc)
        return
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    enqueue(pg_factory, settings, clock, "p-1", project_id="p")
    enqueue(pg_factory, settings, clock, "p-2", project_id="p")
    enqueue(pg_factory, settings, clock, "q-1", project_id="q")
    taken = []
    for _ in range(2):
        with pg_factory.begin() as session:
            found = claims.claim_next_job(session, settings, clock())
            assert found is not None
            taken.append(records.get_job(session, found.job_id).caller_key)
    assert taken == ["p-1", "q-1"]  # p holds 1 net per 1e-6: far above q (0)


def test_a_queued_jobs_place_orders_by_weighted_usage_on_postgresql(
    pg_factory, tmp_path, job_root, clock
):
    """The place in line on PostgreSQL (app/usecases/queue_place.py: each project's usage
    counted once, the claim's usage_by_project, joined to both jobs): p weighs 2, so once p
    and q hold a net each p's usage is 0.5 against q's 1, and both of p's queued jobs come
    before q's older one (weighing 1, p-3 would come after q-2)."""
    settings = shares_of(tmp_path, job_root, 2.0)
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    for key in ("p-1", "q-1", "p-2", "q-2", "p-3"):
        enqueue(pg_factory, settings, clock, key, project_id=key[0])
        clock.advance(1)
    for _ in range(2):
        with pg_factory.begin() as session:
            assert claims.claim_next_job(session, settings, clock()) is not None
    places = {}
    with pg_factory.begin() as session:
        for key in ("p-2", "q-2", "p-3"):
            job = session.get(Job, job_id_for(key))
            found = queue_place(session, job, settings, clock())
            places[key] = (found.place, found.reason)
    assert places == {
        "p-2": (1, "no free net"),
        "p-3": (2, "no free net"),
        "q-2": (3, "no free net"),
    }

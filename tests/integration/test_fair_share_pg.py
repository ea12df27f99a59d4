"""The claim's fair share on the real PostgreSQL (issue 40, app/usecases/fair_share.py): a
project's usage, the nets it holds divided by its weight, is a float8 there, which raises on
overflow where SQLite gives infinity."""

from __future__ import annotations

import json

import pytest

from app.errors import SettingsError
from app.settings import Settings
from app.usecases import claims, records
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
        records.sync_nets(session, settings, clock())
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

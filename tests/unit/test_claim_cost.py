"""A claim that cannot place any job costs one query, however many nets are free; one that
can still takes the warmest free net and the best job for it."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import event

from app.settings import Settings
from app.usecases import claims
from models import NetState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World

NETS = 50


@pytest.fixture
def many(tmp_path, job_root, sqlite_factory, clock) -> World:
    nets = [net_decl(tmp_path, f"net-{i:02d}", "ecs") for i in range(NETS)]
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps(nets),
        PER_JOB_FL_SERVER="true",
    )
    return World(settings, sqlite_factory, clock)


def claim_counting_statements(world: World) -> tuple[claims.Assignment | None, int]:
    statements: list[str] = []
    engine = world.rt.engine

    def count(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement)

    with world.rt.sessions.begin() as session:
        session.connection()  # BEGIN before counting
        event.listen(engine, "before_cursor_execute", count)
        try:
            assignment = claims.claim_next_job(session, world.rt.settings, world.clock())
        finally:
            event.remove(engine, "before_cursor_execute", count)
    return assignment, len(statements)


def test_a_claim_with_nothing_to_place_is_one_query(many: World):
    busy = many.enqueue("running", net="net-07")
    many.run_pipeline(busy)
    for i in range(5):
        many.enqueue(f"waits-{i}", net="net-07")  # pinned to the busy net

    assert claim_counting_statements(many) == (None, 1)


def test_an_empty_queue_is_one_query(many: World):
    assert claim_counting_statements(many) == (None, 1)


def test_a_placeable_job_goes_to_the_warmest_free_net(many: World):
    warm = many.enqueue("warm", net="net-30")
    many.run_to_completion(warm)
    assert many.net("net-30").state == NetState.READY
    pinned = many.enqueue("pinned", net="net-12", priority=5)
    anywhere = many.enqueue("anywhere", required_sites=["site-1"])

    first, _ = claim_counting_statements(many)
    assert first is not None
    assert (first.job_id, first.net_name) == (anywhere, "net-30")  # READY before STOPPED
    second, _ = claim_counting_statements(many)
    assert second is not None
    assert (second.job_id, second.net_name) == (pinned, "net-12")
    assert claim_counting_statements(many) == (None, 1)

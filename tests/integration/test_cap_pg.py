"""A project's cap against two claims at once on the real PostgreSQL (issue 40,
app/usecases/claims.py `_cap_holds`): each claim reads the project's nets in its own snapshot,
so two claims running together would both see it below its cap and both take one of its
jobs. The second waits for the first's commit on the project's advisory lock, counts again and
takes none of that project's jobs (another project's, if one fits), so the cap holds."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import func, select

from app.settings import Settings
from app.usecases import claims, declared_nets, records
from models import ACTIVE_JOB_STATES, Job
from tests.fixtures.db import net_decl
from tests.integration.test_pg_state import enqueue

pytestmark = pytest.mark.integration

HOLD_S = 1.0  # the first claim keeps its transaction open this long after claiming


@pytest.fixture
def capped(tmp_path, job_root) -> Settings:
    nets = [net_decl(tmp_path, "net-a"), net_decl(tmp_path, "net-b")]
    return Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps(nets),
        PROJECT_SHARES=json.dumps({"p": {"max_nets": 1}}),
    )


def test_two_claims_at_once_never_take_a_capped_project_past_its_cap(pg_factory, capped, clock):
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, capped, clock())
    enqueue(pg_factory, capped, clock, "p-1", project_id="p")
    enqueue(pg_factory, capped, clock, "p-2", project_id="p")
    claimed_first = threading.Event()
    results: list[object] = []

    def first() -> None:
        with pg_factory.begin() as session:
            results.append(claims.claim_next_job(session, capped, clock()))
            claimed_first.set()
            time.sleep(HOLD_S)  # not committed yet: the second claim runs meanwhile

    thread = threading.Thread(target=first)
    thread.start()
    assert claimed_first.wait(10)
    started = time.monotonic()
    with pg_factory.begin() as session:
        second = claims.claim_next_job(session, capped, clock())
    waited = time.monotonic() - started
    thread.join()

    assert results[0] is not None
    assert second is None  # p holds its one net: the other job waits
    assert waited >= HOLD_S / 2  # it waited for the first claim's commit to count again
    with pg_factory() as session:
        active = session.scalar(
            select(func.count()).where(Job.project_id == "p", Job.state.in_(ACTIVE_JOB_STATES))
        )
    assert active == 1


def test_a_claim_that_finds_a_project_capped_after_its_read_gives_the_net_to_another_project(
    pg_factory, capped, clock
):
    """As above, but b's job waits too, after p's in the order (a lower priority): the second
    claim, counting p at its cap once the first commits, gives the net it holds locked to b's
    job. Returning nothing ended its claim round (dispatch stops at the first empty claim)
    with a net free and a job fitting it."""
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, capped, clock())
    enqueue(pg_factory, capped, clock, "p-1", project_id="p", priority=10)
    enqueue(pg_factory, capped, clock, "p-2", project_id="p", priority=10)
    enqueue(pg_factory, capped, clock, "b-1", project_id="b")
    claimed_first = threading.Event()
    results: list[object] = []

    def first() -> None:
        with pg_factory.begin() as session:
            results.append(claims.claim_next_job(session, capped, clock()))
            claimed_first.set()
            time.sleep(HOLD_S)  # not committed yet: the second claim runs meanwhile

    thread = threading.Thread(target=first)
    thread.start()
    assert claimed_first.wait(10)
    with pg_factory.begin() as session:
        second = claims.claim_next_job(session, capped, clock())
        taken = None if second is None else records.get_job(session, second.job_id).caller_key
    thread.join()

    assert results[0] is not None
    assert second is not None and taken == "b-1"

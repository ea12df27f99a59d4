"""Two claims of one net on the real PostgreSQL (app/usecases/claims.py): a claim whose
locking statement took its snapshot before another claim's commit, and locks the net after
it, read the net as free in that snapshot (no active job yet) and gave it a second job: the
unique index on one active job per net refused the write, and the claim raised
IntegrityError out of the assign round (found by the race harness, tests/fixtures/pg_race.py,
seed 58 of 31-60, once). A stray run recorded on the net meanwhile was missed the same way,
and nothing refused that. The net is read free again after its lock, in a fresh snapshot."""

from __future__ import annotations

from functools import partial

import pytest
from sqlalchemy import select

from app.usecases import claims, declared_nets, records
from models import Job, JobState, ReasonCode
from tests.integration.test_drain_pg import claim_paused_while
from tests.integration.test_pg_state import enqueue

pytestmark = pytest.mark.integration


def _claim(db, settings, clock) -> claims.Assignment | None:
    """A claim, committed."""
    with db.begin() as session:
        return claims.claim_next_job(session, settings, clock())


def test_a_claim_whose_lock_snapshot_predates_another_claim_of_the_net_takes_nothing_there(
    pg_factory, settings, clock, monkeypatch
):
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    first = enqueue(pg_factory, settings, clock, "first", net="net-a")
    second = enqueue(pg_factory, settings, clock, "second", net="net-a")
    # Another claim, not paused, takes the net and commits inside the paused one's statement.
    another_claim = partial(_claim, pg_factory, settings, clock)
    outcome, taken = claim_paused_while(pg_factory, settings, clock, monkeypatch, another_claim)
    assert taken is not None and taken.net_name == "net-a"
    assert outcome == [None], outcome
    (other,) = {first, second} - {taken.job_id}
    with pg_factory() as session:
        state = session.scalar(select(Job.state).where(Job.id == other))
    assert state == JobState.QUEUED


def test_a_claim_whose_lock_snapshot_predates_a_stray_run_on_the_net_takes_nothing_there(
    pg_factory, settings, clock, monkeypatch
):
    """A run no job counts, recorded on the net while the claim is inside its locking
    statement (the monitor keeping a lost job's run as a stray), keeps the net from a new job
    until it is settled: one live run per server."""
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    lost = enqueue(pg_factory, settings, clock, "lost", net="net-a")
    with pg_factory.begin() as session:  # the job whose run is the stray: over
        records.finish_job(
            session, lost, JobState.ABORTED, "lost", clock(), code=ReasonCode.ABORTED
        )
    waiting = enqueue(pg_factory, settings, clock, "waiting", net="net-a")

    def a_stray_recorded() -> None:
        with pg_factory.begin() as session:
            records.add_stray_run(
                session,
                net_name="net-a",
                job_id=lost,
                nvflare_job_id="run-1",
                submit_token=None,
                reason="a run no job counts",
                now=clock(),
            )

    outcome, _ = claim_paused_while(pg_factory, settings, clock, monkeypatch, a_stray_recorded)
    assert outcome == [None]
    with pg_factory() as session:
        state = session.scalar(select(Job.state).where(Job.id == waiting))
    assert state == JobState.QUEUED


def test_a_claim_that_finds_its_first_net_taken_after_the_lock_takes_the_next_free_net(
    pg_factory, settings, clock, monkeypatch
):
    """The re-read after the lock failing on one net ends only that net's turn: the claim
    goes on to the next free net a queued job fits (a claim that takes nothing ends its
    assign round, so a None here would leave net-b idle beside a waiting job)."""
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    jobs = {enqueue(pg_factory, settings, clock, key) for key in ("first", "second")}
    another_claim = partial(_claim, pg_factory, settings, clock)
    outcome, taken = claim_paused_while(pg_factory, settings, clock, monkeypatch, another_claim)
    assert taken is not None and taken.net_name == "net-a"
    (slow,) = outcome
    assert isinstance(slow, claims.Assignment), slow
    assert slow.net_name == "net-b" and {slow.job_id, taken.job_id} == jobs

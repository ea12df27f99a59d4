"""A claim of a net that declares its sites, beside a claim of another net, on the real
PostgreSQL (app/usecases/claims.py `_next_job_for`): the jobs it passes over are not locked
(they were, to the claim's commit, until round 9's break-it review)."""

from __future__ import annotations

import json
import threading

import pytest

from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases import claims, declared_nets
from app.usecases import enqueue as enqueue_uc
from tests.fixtures.db import net_decl

pytestmark = pytest.mark.integration


def _enqueue(db, settings, clock, key, sites, **kw):
    with db.begin() as session:
        job = EnqueueJob(caller_key=key, definition="tiny-job", required_sites=sites, **kw)
        return enqueue_uc.enqueue_job(session, settings, job, clock()).job_id


def test_a_claim_scanning_a_sited_nets_queue_keeps_no_lock_on_the_jobs_it_passes(
    pg_factory, tmp_path, job_root, clock
):
    """A net that declares its sites takes the first job it has the sites of (asked in the
    claim's statement, `site_fit`) and locks only that one: a concurrent claim of another net
    takes `old` (first in line, fitting net-b), not `pinned`, younger. Read FOR UPDATE SKIP
    LOCKED, as until round 9, every job the scan passed stayed locked to its commit and
    `pinned` was taken."""
    nets = [net_decl(tmp_path, "net-a", sites=["site-1", "site-2"]), net_decl(tmp_path, "net-b")]
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=job_root, NETS=json.dumps(nets)
    )
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    old = _enqueue(pg_factory, settings, clock, "old", ["site-9"])  # net-a lacks it
    clock.advance(1)
    fits_a = _enqueue(pg_factory, settings, clock, "fits-a", ["site-1"])
    clock.advance(1)
    pinned = _enqueue(pg_factory, settings, clock, "pinned", ["site-9"], net="net-b")
    keys = {old: "old", fits_a: "fits-a", pinned: "pinned"}
    claimed, release = threading.Event(), threading.Event()
    first: list[object] = []

    def claim_holding_locks() -> None:  # net-a's claim, its locks held until released
        with pg_factory.begin() as session:
            first.append(claims.claim_next_job(session, settings, clock()))
            claimed.set()
            release.wait(10)

    thread = threading.Thread(target=claim_holding_locks)
    thread.start()
    claimed.wait(10)
    try:
        with pg_factory.begin() as session:
            second = claims.claim_next_job(session, settings, clock())
    finally:
        release.set()
        thread.join()
    (one,) = first
    assert isinstance(one, claims.Assignment) and (one.net_name, one.job_id) == ("net-a", fits_a)
    assert second is not None and second.net_name == "net-b"
    assert keys[second.job_id] == "old"


def test_a_sited_nets_claim_passes_a_job_another_claim_holds_for_the_next_that_fits(
    pg_factory, tmp_path, job_root, clock
):
    """The scan reads without locks, so it lists a job another claim holds locked; locking it
    by id skips it (SKIP LOCKED), and the claim takes the next job that fits, not none."""
    from sqlalchemy import select

    from models import Job

    nets = [net_decl(tmp_path, "net-a", sites=["site-1", "site-2"])]
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=job_root, NETS=json.dumps(nets)
    )
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    held = _enqueue(pg_factory, settings, clock, "held", ["site-1"])
    clock.advance(1)
    nxt = _enqueue(pg_factory, settings, clock, "next", ["site-2"])
    with pg_factory.begin() as holder:  # another claim's lock on the first job, uncommitted
        holder.scalar(select(Job).where(Job.id == held).with_for_update())
        with pg_factory.begin() as session:
            taken = claims.claim_next_job(session, settings, clock())
    assert taken is not None and (taken.net_name, taken.job_id) == ("net-a", nxt)

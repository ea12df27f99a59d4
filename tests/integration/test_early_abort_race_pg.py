"""An abort for a job not stored yet and that job's enqueue, committing at the same time on
PostgreSQL (READ COMMITTED): neither may miss the other (app.usecases.early_aborts). An abort
that stored its row and then looked for the job, and an enqueue that inserted the job and
then looked for the row, each missed the other's uncommitted row: the job ran."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select, text

from app.schemas import EnqueueJob, job_id_for
from app.usecases import early_aborts, enqueue, requests
from models import EarlyAbort, Job, JobState, ReasonCode
from tests.fixtures.pg_waits import run_together, wait_for_a_lock_wait_or, worker_runtime

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(pg_factory, settings, clock):
    """A worker's runtime (coalesced kicks) on PostgreSQL with the nets' rows."""
    return worker_runtime(pg_factory, settings, clock, coalesced=True)


def _payload(key: str) -> dict[str, object]:
    return {"caller_key": key, "definition": "tiny-job", "net": "net-a"}


def _state(pg_factory, key: str) -> JobState:
    with pg_factory() as session:
        job = session.get(Job, job_id_for(key))
        assert job is not None
        return job.state


def _kept(pg_factory) -> list[str]:
    with pg_factory() as session:
        return [str(j) for j in session.scalars(select(EarlyAbort.job_id))]


def test_an_abort_while_the_enqueue_is_uncommitted_waits_for_it_and_aborts_the_job(
    rt, pg_factory, settings, clock
):
    """The enqueue inserted its job and looked (no abort kept), not committed yet; the
    abort finds no job: its placeholder waits at the job's key for the enqueue's commit,
    then meets the job, and aborts it as any QUEUED job."""
    enqueuing = pg_factory()
    request = EnqueueJob(caller_key="k", definition="tiny-job", net="net-a")
    stored = enqueue.enqueue_job(enqueuing, settings, request, clock())
    assert stored.state == JobState.QUEUED
    answers: list[str] = []
    payload = {"job_id": str(job_id_for("k")), "reason": "user cancelled"}
    abort = threading.Thread(target=lambda: answers.append(requests.abort_job(rt, payload)))
    abort.start()
    wait_for_a_lock_wait_or(abort, pg_factory)
    enqueuing.commit()
    enqueuing.close()
    abort.join(timeout=10)
    assert answers == ["ABORTED"]
    assert _state(pg_factory, "k") == JobState.ABORTED
    assert _kept(pg_factory) == []


def test_an_enqueue_while_the_abort_is_uncommitted_waits_for_it_and_stores_the_job_aborted(
    rt, pg_factory, clock
):
    """The abort found no job and kept itself, not committed yet; the enqueue's insert waits
    at the job's key (the abort's placeholder) for that commit, then reads the kept abort
    in its next statement: the job is stored ABORTED."""
    aborting = pg_factory()
    kept = early_aborts.keep(
        aborting,
        job_id_for("k"),
        "user cancelled",
        ReasonCode.ABORTED,
        now=clock(),
        retention_s=rt.settings.rejected_retention_s,
    )
    assert kept is not None
    answers: list[dict[str, object]] = []
    enqueue_ = threading.Thread(
        target=lambda: answers.append(requests.enqueue_job(rt, _payload("k")))
    )
    enqueue_.start()
    wait_for_a_lock_wait_or(enqueue_, pg_factory)
    aborting.commit()
    aborting.close()
    enqueue_.join(timeout=10)
    assert [a["state"] for a in answers] == ["ABORTED"]
    assert _state(pg_factory, "k") == JobState.ABORTED
    assert _kept(pg_factory) == []


def test_racing_aborts_and_enqueues_never_leave_a_job_queued_with_an_abort_kept(rt, pg_factory):
    """Many pairs started together, each in either order: every job ends ABORTED, and no
    kept abort is left for a job that exists."""
    pairs = 12
    calls: list[Any] = []
    for i in range(pairs):
        key = f"pair-{i}"
        payload = {"job_id": str(job_id_for(key)), "reason": "user cancelled"}
        calls += [
            lambda p=payload: requests.abort_job(rt, p),
            lambda k=key: requests.enqueue_job(rt, _payload(k)),
        ]
    errors = run_together(calls)
    assert errors == []
    assert {_state(pg_factory, f"pair-{i}") for i in range(pairs)} == {JobState.ABORTED}
    assert _kept(pg_factory) == []
    with pg_factory() as session:  # no placeholder outlived its transaction
        assert session.scalar(text("SELECT count(*) FROM jobs WHERE caller_key LIKE '#%'")) == 0

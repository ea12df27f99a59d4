"""Two copies of one enqueue message on PostgreSQL (READ COMMITTED), one refused on a stale
judgement (the definition's upload not visible yet) and one accepted (judged once it was),
committing at the same time: the request is never both a job and a refusal
(app.usecases.id_probe, `intake.refuse_enqueue`). A refusal that read no job, and an
enqueue that inserted its job, then looked for the message's refusal, each missed the
other's uncommitted row: flip-api was told `rejected` and the job ran."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import func, select, text

from app.errors import InvalidRequest
from app.schemas import EnqueueJob, job_id_for
from app.usecases import enqueue, intake, requests
from models import Job, RejectedRequest
from tests.fixtures.pg_waits import run_together, wait_for_a_lock_wait_or, worker_runtime

pytestmark = pytest.mark.integration

STALE = InvalidRequest("definition 'tiny-job' not found under JOB_ROOT")


@pytest.fixture
def rt(pg_factory, settings, clock):
    """A worker's runtime (coalesced kicks) on PostgreSQL with the nets' rows."""
    return worker_runtime(pg_factory, settings, clock, coalesced=True)


def _payload(key: str) -> dict[str, object]:
    return {"caller_key": key, "definition": "tiny-job", "net": "net-a"}


def _jobs_and_refusals(pg_factory, key: str) -> tuple[int, int]:
    with pg_factory() as session:
        jobs = session.scalar(select(func.count()).where(Job.caller_key == key))
        refused = session.scalar(select(func.count()).where(RejectedRequest.caller_key == key))
        return int(jobs or 0), int(refused or 0)


def test_a_refusal_while_the_copys_enqueue_is_uncommitted_waits_and_answers_its_job(
    rt, pg_factory, settings, clock
):
    """Copy 2 inserted its job and looked for the message's refusal (none), not committed
    yet; copy 1's refusal, judged before the upload showed up, waits at the job's key for
    that commit, then finds the same request's job: its answer, and nothing is refused."""
    enqueuing = pg_factory()
    request = EnqueueJob.model_validate(_payload("k"))
    assert enqueue.enqueue_job(enqueuing, settings, request, clock()).created
    assert not enqueue.refused_before(enqueuing, "m-1")
    answers: list[Any] = []
    refusal = threading.Thread(
        target=lambda: answers.append(intake.refuse_enqueue(rt, _payload("k"), STALE, "m-1"))
    )
    refusal.start()
    wait_for_a_lock_wait_or(refusal, pg_factory)
    enqueuing.commit()
    enqueuing.close()
    refusal.join(timeout=10)
    assert answers == [enqueue.Enqueued(job_id_for("k"), created=False, state="QUEUED")]
    assert _jobs_and_refusals(pg_factory, "k") == (1, 0)


def test_an_enqueue_while_the_copys_refusal_is_uncommitted_waits_and_is_refused(
    rt, pg_factory, monkeypatch
):
    """Copy 1 recorded its refusal, not committed yet; copy 2's insert waits at the job's
    key (the refusal's placeholder) for that commit, then reads the message's refusal in
    its next statement: answered `rejected`, no job."""
    recorded = threading.Event()
    release = threading.Event()
    real = enqueue.record_rejection

    def record_then_hold(*args: Any, **kwargs: Any) -> Any:
        kept = real(*args, **kwargs)
        recorded.set()
        release.wait(timeout=10)  # inside the refusal's transaction: not committed yet
        return kept

    monkeypatch.setattr(enqueue, "record_rejection", record_then_hold)
    refused: list[Any] = []
    refusal = threading.Thread(
        target=lambda: refused.append(intake.refuse_enqueue(rt, _payload("k"), STALE, "m-2"))
    )
    refusal.start()
    assert recorded.wait(timeout=10)
    accepted: list[dict[str, object]] = []
    copy = threading.Thread(
        target=lambda: accepted.append(requests.enqueue_job(rt, _payload("k"), "m-2"))
    )
    copy.start()
    wait_for_a_lock_wait_or(copy, pg_factory)
    release.set()
    refusal.join(timeout=10)
    copy.join(timeout=10)
    assert [str(r) for r in refused] == ["rejected"]
    assert [a.get("reason_code") for a in accepted] == ["rejected"], accepted
    assert _jobs_and_refusals(pg_factory, "k") == (0, 1)


def test_racing_copies_are_each_one_job_or_one_refusal(rt, pg_factory):
    """Many messages, each a stale refusal and an accepting copy started together in either
    order: every key is one job and no refusal, or one refusal and no job; no placeholder
    outlives its transaction."""
    pairs = 12
    calls: list[Any] = []
    for i in range(pairs):
        key, message = f"pair-{i}", f"m-pair-{i}"
        calls += [
            lambda k=key, m=message: intake.refuse_enqueue(rt, _payload(k), STALE, m),
            lambda k=key, m=message: requests.enqueue_job(rt, _payload(k), m),
        ]
    assert run_together(calls) == []
    outcomes = {_jobs_and_refusals(pg_factory, f"pair-{i}") for i in range(pairs)}
    assert outcomes <= {(1, 0), (0, 1)}, outcomes
    with pg_factory() as session:
        assert session.scalar(text("SELECT count(*) FROM jobs WHERE caller_key LIKE '#%'")) == 0


def test_a_malformed_requests_refusal_writes_no_placeholder_and_waits_for_nothing(
    rt, pg_factory, settings, clock
):
    """A payload no enqueue could accept (a field the model refuses) cannot have become a
    job meanwhile: its refusal only reads the key's job (a flood of bad requests writes no
    placeholder rows in `jobs`), so it does not wait for an enqueue of that key in flight,
    and reads as `rejected` (the job it would conflict with is not committed)."""
    enqueuing = pg_factory()
    request = EnqueueJob.model_validate(_payload("k"))
    assert enqueue.enqueue_job(enqueuing, settings, request, clock()).created
    answers: list[Any] = []
    bad = {"caller_key": "k", "definition": "", "net": "net-a"}
    refusal = threading.Thread(
        target=lambda: answers.append(intake.refuse_enqueue(rt, bad, STALE, "m-3"))
    )
    refusal.start()
    refusal.join(timeout=3)
    ended_first = not refusal.is_alive()
    enqueuing.commit()
    enqueuing.close()
    refusal.join(timeout=10)
    assert ended_first, "the refusal of a malformed payload waited for the enqueue's commit"
    assert [str(a) for a in answers] == ["rejected"]

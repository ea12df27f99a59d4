"""An abort (or flip-api's `stopped`) that comes before its job's enqueue is stored
(app.usecases.early_aborts): kept for REJECTED_RETENTION_S, carried out by the enqueue that
creates the job, in its transaction; everything else as it was."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app import names
from app.schemas import job_id_for
from app.usecases import dispatch, kicks, requests
from models import EarlyAbort, JobEvent, JobState, PendingKick, ReasonCode


def _enqueue(world, key: str) -> dict[str, object]:
    world.clock.advance(1)
    return requests.enqueue_job(
        world.rt, {"caller_key": key, "definition": "tiny-job", "net": "net-a"}
    )


def _abort(world, key: str, reason: str = "user cancelled") -> str:
    return requests.abort_job(world.rt, {"job_id": str(job_id_for(key)), "reason": reason})


def _kept(world) -> list[tuple[str, str, str]]:
    with world.rt.sessions() as session:
        rows = session.scalars(select(EarlyAbort).order_by(EarlyAbort.asked_at))
        return [(str(r.job_id), r.reason, r.reason_code) for r in rows]


def _history(world, job_id) -> list[tuple[JobState | None, JobState, str | None]]:
    with world.rt.sessions() as session:
        events = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        )
        return [(e.from_state, e.to_state, e.reason_code) for e in events]


def test_an_abort_before_its_enqueue_is_kept_and_the_enqueue_stores_the_job_aborted(world):
    answer = _abort(world, "k", "user cancelled")
    job_id = job_id_for("k")
    assert answer.startswith(f"rejected: job {job_id} not found; the abort is kept until ")
    assert _kept(world) == [(str(job_id), "user cancelled", "aborted")]
    world.outbox.sent.clear()
    enqueued = _enqueue(world, "k")
    assert enqueued == {"job_id": str(job_id), "created": True, "state": "ABORTED"}
    job = world.job(job_id)
    assert (job.state, job.reason_code) == (JobState.ABORTED, "aborted")
    # Its history is an abort of a QUEUED job's: a status callback for each move.
    assert _history(world, job_id) == [
        (None, JobState.QUEUED, None),
        (JobState.QUEUED, JobState.ABORTED, "aborted"),
    ]
    assert _kept(world) == []
    assert [m for m in world.outbox.sent if m[0] == names.ASSIGN_NEXT_JOB] == []
    assert dispatch.claim_and_start(world.rt) == []
    # The enqueue sent again (a retry) is answered by the job, still ABORTED.
    again = _enqueue(world, "k")
    assert again == {"job_id": str(job_id), "created": False, "state": "ABORTED"}


def test_a_worker_s_enqueue_reads_the_kept_abort_with_its_kick_and_sets_no_marker(world):
    """Coalesced kicks (a worker's runtime): the look is a column of the marker's read."""
    kicks.coalesce_kicks(world.rt)
    _abort(world, "k")
    assert _enqueue(world, "k")["state"] == "ABORTED"
    with world.rt.sessions() as session:
        assert session.scalars(select(PendingKick)).all() == []
    assert [m for m in world.outbox.sent if m[0] == names.ASSIGN_NEXT_JOB] == []
    assert _enqueue(world, "other")["state"] == "QUEUED"  # the next job kicks as before
    assert [m[0] for m in world.outbox.sent] == [names.ASSIGN_NEXT_JOB]


def test_a_stopped_report_before_its_enqueue_ends_the_job_as_reported(world):
    job_id = job_id_for("k")
    payload = {"job_id": str(job_id), "status": "stopped", "detail": "user stopped it"}
    answer = requests.report_job_status(world.rt, payload)
    assert answer.startswith(f"rejected: job {job_id} not found; the abort is kept until ")
    assert _enqueue(world, "k")["state"] == "ABORTED"
    job = world.job(job_id)
    assert job.reason_code == ReasonCode.REPORTED_STOPPED
    assert _history(world, job_id)[-1] == (JobState.QUEUED, JobState.ABORTED, "reported_stopped")
    with world.rt.sessions() as session:
        reason = session.scalar(
            select(JobEvent.reason).where(JobEvent.to_state == JobState.ABORTED)
        )
    assert reason == "flip-api reported stopped: user stopped it"


def test_other_reports_for_a_job_not_stored_are_refused_and_keep_nothing(world):
    job_id = job_id_for("k")
    payload = {"job_id": str(job_id), "status": "results_uploaded"}
    assert requests.report_job_status(world.rt, payload) == f"rejected: job {job_id} not found"
    assert _kept(world) == []
    assert _enqueue(world, "k")["state"] == "QUEUED"


def test_the_first_abort_kept_wins_and_its_repeat_keeps_one_row(world):
    first = _abort(world, "k", "first")
    assert _abort(world, "k", "second") == first  # the same "kept until"
    assert [reason for _, reason, _ in _kept(world)] == ["first"]
    _enqueue(world, "k")
    with world.rt.sessions() as session:
        aborted = session.scalars(
            select(JobEvent.reason).where(JobEvent.to_state == JobState.ABORTED)
        ).all()
    assert aborted == ["first"]


def test_an_abort_for_an_id_never_enqueued_expires(world):
    """Kept REJECTED_RETENTION_S, as a refused request: an enqueue after that is a job like
    any, and the next abort kept drops the expired one."""
    _abort(world, "typo")
    world.clock.advance(world.rt.settings.rejected_retention_s + 1)
    assert _enqueue(world, "typo")["state"] == "QUEUED"
    assert world.job(job_id_for("typo")).state == JobState.QUEUED
    _abort(world, "another")
    assert [job for job, _, _ in _kept(world)] == [str(job_id_for("another"))]


def test_the_kept_until_is_the_retention_from_the_abort(world):
    _abort(world, "k")
    with world.rt.sessions() as session:
        kept = session.scalars(select(EarlyAbort)).one()
    retention = timedelta(seconds=world.rt.settings.rejected_retention_s)
    assert kept.kept_until - kept.asked_at == retention
    assert kept.asked_at == world.clock()


def test_an_abort_after_the_enqueue_is_as_before_and_keeps_nothing(world):
    """The ordinary path: the job is found and aborted at once."""
    assert _enqueue(world, "k")["state"] == "QUEUED"
    assert _abort(world, "k") == "ABORTED"
    assert _kept(world) == []
    assert _history(world, job_id_for("k"))[-1] == (
        JobState.QUEUED,
        JobState.ABORTED,
        "aborted",
    )


def test_an_enqueue_with_no_abort_kept_queues_and_is_claimed_as_before(world):
    _abort(world, "someone-else")  # a kept abort for another id changes nothing here
    assert _enqueue(world, "k")["state"] == "QUEUED"
    assert [a.job_id for a in dispatch.claim_and_start(world.rt)] == [job_id_for("k")]
    assert len(_kept(world)) == 1


def test_a_kept_code_this_release_does_not_know_still_aborts_the_job(world):
    """A row a newer release kept, then rolled back: the enqueue is not failed by it."""
    with world.rt.sessions.begin() as session:
        session.add(
            EarlyAbort(
                job_id=job_id_for("k"),
                reason="from a newer release",
                reason_code="some_later_code",
                asked_at=world.clock(),
                kept_until=world.clock() + timedelta(days=1),
            )
        )
    assert _enqueue(world, "k")["state"] == "ABORTED"
    assert world.job(job_id_for("k")).reason_code == ReasonCode.ABORTED

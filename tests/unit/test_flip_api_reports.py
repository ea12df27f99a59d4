"""flip-api's terminal-status report: the job ends with flip-api's words as its reason, a
job that has not run yet only accepts "stopped", and a results-report timeout never touches
a job that is no longer waiting for it."""

from __future__ import annotations

import pytest

from app.errors import InvalidRequest
from app.schemas import ReportedStatus, ReportJobStatus
from app.usecases import dispatch, records
from models import JobState


def _report(world, job_id, status: ReportedStatus, detail: str = "") -> JobState:
    with world.rt.sessions.begin() as session:
        return records.report_job_status(
            session, ReportJobStatus(job_id=job_id, status=status, detail=detail), world.clock()
        )


def test_the_job_ends_with_what_flip_api_reported_and_its_detail(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    assert _report(world, job_id, ReportedStatus.RESULTS_UPLOAD_FAILED, "disk full") == (
        JobState.FAILED
    )
    assert world.job(job_id).last_error == "flip-api reported results_upload_failed: disk full"


def test_a_report_without_detail_says_only_what_was_reported(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    assert _report(world, job_id, ReportedStatus.ERROR) == JobState.FAILED
    assert world.job(job_id).last_error == "flip-api reported error"


def test_a_job_that_has_not_run_yet_only_accepts_stopped(world):
    job_id = world.enqueue("j", net="net-a")
    with pytest.raises(InvalidRequest, match="has not run yet; only 'stopped' applies"):
        _report(world, job_id, ReportedStatus.RESULTS_UPLOADED)
    assert world.job(job_id).state == JobState.QUEUED
    assert _report(world, job_id, ReportedStatus.STOPPED) == JobState.ABORTED


def test_a_report_timeout_leaves_a_job_that_is_not_finishing_alone(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        assert not records.expire_report_wait(
            session, job_id, JobState.FAILED, 3600.0, world.clock()
        )
    assert world.job(job_id).state == JobState.RUNNING


def test_results_reported_for_a_job_that_has_not_run_is_refused_plainly(world):
    from app.errors import InvalidRequest
    from app.schemas import ReportedStatus, ReportJobStatus

    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    report = ReportJobStatus(job_id=job_id, status=ReportedStatus.RESULTS_UPLOADED)
    with world.rt.sessions.begin() as session, pytest.raises(InvalidRequest):
        records.report_job_status(session, report, world.clock())
    assert world.job(job_id).state == JobState.ASSIGNED

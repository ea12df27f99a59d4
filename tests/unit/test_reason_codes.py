"""Every way a job ends carries a machine-readable reason code beside its human reason: on
the job, on its terminal history row and in the callback payload of that row, and a move to
a terminal state without one (or with one the table does not list for it) is refused."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import select

from app.schemas import ReportedStatus, ReportJobStatus
from app.usecases import abort, intake, monitor, records
from app.usecases.callbacks.payloads import event_payload, rejection_payload
from models import (
    REASONS,
    TERMINAL_JOB_STATES,
    IllegalTransition,
    Job,
    JobEvent,
    JobState,
    ReasonCode,
    RejectedRequest,
)
from tests.unit.conftest import World, one_net_world


def _running(world: World, **kw) -> uuid.UUID:
    job_id = world.enqueue(f"j-{uuid.uuid4().hex[:8]}", net="net-a", **kw)
    world.run_pipeline(job_id)
    return uuid.UUID(str(job_id))


def _run_ends(status: str) -> Callable[[World], uuid.UUID]:
    def scenario(world: World) -> uuid.UUID:
        job_id = _running(world)
        world.server("net-a").statuses["nv-1"] = status
        monitor.monitor_running_jobs(world.rt)
        return job_id

    return scenario


def _reported(status: ReportedStatus) -> Callable[[World], uuid.UUID]:
    def scenario(world: World) -> uuid.UUID:
        job_id = _running(world)
        intake.report_status(world.rt, ReportJobStatus(job_id=job_id, status=status))
        return job_id

    return scenario


def _overran(world: World) -> uuid.UUID:
    job_id = _running(world)
    world.clock.advance(world.rt.settings.max_run_s + 1)
    monitor.monitor_running_jobs(world.rt)
    return job_id


def _lost_past_attempts(world: World) -> uuid.UUID:
    job_id = _running(world, max_attempts=1)
    world.server("net-a").statuses["nv-1"] = "FINISHED:ABNORMAL"
    monitor.monitor_running_jobs(world.rt)  # LOST_JOB_POLICY=requeue, no attempt left
    return job_id


def _aborted_queued(world: World) -> uuid.UUID:
    job_id = uuid.UUID(str(world.enqueue("queued", net="net-a")))
    world.abort(job_id)
    return job_id


def _aborted_running(world: World) -> uuid.UUID:
    job_id = _running(world)
    world.abort(job_id)  # ABORTING, then the worker's abort_on_server
    return job_id


def _abort_seen_done_by_the_monitor(world: World) -> uuid.UUID:
    job_id = _running(world)
    intake.request_abort(world.rt, job_id, "user")  # ABORTING
    world.server("net-a").statuses["nv-1"] = "FINISHED:ABORTED"  # the abort took
    monitor.monitor_running_jobs(world.rt)  # before abort_on_server heard of it
    return job_id


def _abort_never_confirmed(world: World) -> uuid.UUID:
    job_id = _running(world)
    intake.request_abort(world.rt, job_id, "user")
    world.clock.advance(world.rt.settings.abort_timeout_s + 1)
    abort.expire_abort(world.rt, job_id)
    return job_id


SCENARIOS: dict[str, tuple[Callable[[World], uuid.UUID], JobState, ReasonCode]] = {
    "run completed": (
        _run_ends("FINISHED:COMPLETED"),
        JobState.COMPLETED,
        ReasonCode.RUN_COMPLETED,
    ),
    "run failed": (
        _run_ends("FINISHED:EXECUTION_EXCEPTION"),
        JobState.FAILED,
        ReasonCode.RUN_FAILED,
    ),
    "run aborted by NVFLARE": (
        _run_ends("FINISHED:ABORTED"),
        JobState.ABORTED,
        ReasonCode.RUN_ABORTED,
    ),
    "overran": (_overran, JobState.FAILED, ReasonCode.OVERRAN),
    "attempts used up": (_lost_past_attempts, JobState.FAILED, ReasonCode.MAX_ATTEMPTS),
    "reported uploaded": (
        _reported(ReportedStatus.RESULTS_UPLOADED),
        JobState.COMPLETED,
        ReasonCode.RESULTS_UPLOADED,
    ),
    "reported upload failed": (
        _reported(ReportedStatus.RESULTS_UPLOAD_FAILED),
        JobState.FAILED,
        ReasonCode.RESULTS_UPLOAD_FAILED,
    ),
    "reported error": (
        _reported(ReportedStatus.ERROR),
        JobState.FAILED,
        ReasonCode.REPORTED_ERROR,
    ),
    "reported stopped": (
        _reported(ReportedStatus.STOPPED),
        JobState.ABORTED,
        ReasonCode.REPORTED_STOPPED,
    ),
    "aborted while queued": (_aborted_queued, JobState.ABORTED, ReasonCode.ABORTED),
    "aborted while running": (_aborted_running, JobState.ABORTED, ReasonCode.ABORTED),
    "abort seen done by the monitor": (
        _abort_seen_done_by_the_monitor,
        JobState.ABORTED,
        ReasonCode.ABORTED,
    ),
    "abort never confirmed": (
        _abort_never_confirmed,
        JobState.ABORTED,
        ReasonCode.ABORT_UNCONFIRMED,
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_end_carries_its_code_on_the_job_its_history_and_its_callback(world, name):
    scenario, state, code = SCENARIOS[name]
    job_id = scenario(world)
    with world.rt.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        last = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id.desc())
        ).first()
        assert last is not None
        assert (job.state, job.reason_code, last.to_state, last.reason_code) == (
            state,
            code,
            state,
            code,
        )
        payload = event_payload(job, last)
    assert (payload.to_state, payload.reason_code) == (state, code)
    assert state in REASONS[code].flip  # the FLIP table knows this end


def test_a_report_timeout_ends_the_job_with_its_code(held_for_report):
    world = held_for_report
    job_id = world.enqueue("held", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.FINISHING
    with world.rt.sessions.begin() as session:
        records.expire_report_wait(session, job_id, JobState.FAILED, 3600.0, world.clock())
    assert world.job(job_id).reason_code == ReasonCode.REPORT_TIMEOUT


def test_a_lost_server_with_the_fail_policy_says_server_lost(
    tmp_path, job_root, sqlite_factory, clock
):
    world = one_net_world(
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        LOST_JOB_POLICY="fail",
    )
    job_id = _running(world)
    world.server("net-a").statuses["nv-1"] = "FINISHED:ABANDONED"
    monitor.monitor_running_jobs(world.rt)
    assert (world.job(job_id).state, world.job(job_id).reason_code) == (
        JobState.FAILED,
        ReasonCode.SERVER_LOST,
    )


def test_a_non_terminal_move_carries_no_code(world):
    job_id = _running(world)
    with world.rt.sessions() as session:
        codes = session.scalars(select(JobEvent.reason_code).where(JobEvent.job_id == job_id)).all()
    assert codes == [None, None, None, None]  # enqueued, assigned, dispatching, running
    assert world.job(job_id).reason_code is None


@pytest.mark.parametrize("target", sorted(TERMINAL_JOB_STATES))
def test_a_terminal_move_without_a_code_or_with_a_wrong_one_is_refused(world, target):
    job_id = world.enqueue("k", net="net-a")
    wrong = next(c for c, r in REASONS.items() if r.flip and target not in r.flip)
    with world.rt.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.state = JobState.RUNNING  # every terminal state is reachable from RUNNING
        with pytest.raises(IllegalTransition):
            job.transition(target, world.clock(), "no code")
        with pytest.raises(IllegalTransition):
            job.transition(target, world.clock(), "wrong code", code=wrong)
        with pytest.raises(IllegalTransition):
            job.transition(JobState.ABORTING, world.clock(), "a code", code=ReasonCode.ABORTED)
        assert job.state == JobState.RUNNING


def test_a_refused_enqueue_says_rejected_and_a_failed_job_never_does(world):
    """A missing bundle fails a job (bundle_missing); a refused enqueue created none
    (rejected): the codes tell them apart, and the failed job's words no longer start with
    "rejected"."""
    intake.record_refusal(world.rt, "bad-key", "unknown net 'net-9'")
    with world.rt.sessions() as session:
        rejection = session.scalars(select(RejectedRequest)).one()
        payload = rejection_payload(rejection)
    assert (payload.kind, payload.reason_code) == ("rejected", ReasonCode.REJECTED)

    job_id = world.enqueue("gone", net="net-a")
    (world.rt.settings.job_root / "tiny-job" / "meta.json").unlink(missing_ok=True)
    import shutil

    shutil.rmtree(world.rt.settings.job_root / "tiny-job")
    from app.usecases import dispatch

    assignment = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    dispatch.scale_up(world.rt, job_id, "net-a", assignment.attempt)
    job = world.job(job_id)
    assert (job.state, job.reason_code) == (JobState.FAILED, ReasonCode.BUNDLE_MISSING)
    assert not (job.last_error or "").startswith("rejected")


def test_the_table_covers_every_code_and_each_end_state_maps_to_flip():
    assert set(REASONS) == set(ReasonCode)
    for code, reason in REASONS.items():
        assert reason.meaning
        assert reason.flip, code
        for state in reason.flip:
            assert state is None or state in TERMINAL_JOB_STATES, (code, state)

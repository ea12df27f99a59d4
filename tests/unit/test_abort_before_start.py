"""An abort answered "aborted before running it" (the run was SUBMITTED or DISPATCHED) is
never proof the run is over: nvflare 2.9's job runner, if it was starting the run, sets it
RUNNING over the mark. The run is kept as a stray run, which holds its net, until a status
read after RUN_START_WINDOW_S says it is over (CI saw such an abort not take; the sweep's
racy seeds 21 and 192 ran the next job beside it)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.db import unit_of_work
from app.usecases import abort, dispatch, intake, services
from models import JobEvent, JobState, StrayRun
from tests.unit.abort_replies import held_for_one_window

WINDOW = timedelta(seconds=abort.RUN_START_WINDOW_S)


def _strays(world) -> list[StrayRun]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def _aborted_while_starting(world, status: str = "DISPATCHED"):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = status
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    return job_id


def _record_nv1_again(world, job_id, reason: str) -> None:
    """Record run nv-1 of the job on net-a as a stray, held for one window from now."""
    with unit_of_work(world.rt.sessions) as session:
        services.add_stray_run(
            session,
            net_name="net-a",
            job_id=job_id,
            nvflare_job_id="nv-1",
            submit_token=None,
            reason=reason,
            now=world.clock(),
            settle_after=world.clock() + WINDOW,
        )


def test_the_run_is_kept_as_a_stray_until_the_runner_cannot_start_it(world):
    job_id = _aborted_while_starting(world)
    with world.rt.sessions() as session:
        reason = session.scalars(select(JobEvent.reason).where(JobEvent.job_id == job_id)).all()
    assert reason[-1] == "aborted on the server before it started"
    [stray] = _strays(world)
    assert stray.nvflare_job_id == "nv-1"
    assert stray.settle_after == world.clock() + WINDOW
    # The status reads over at once (FINISHED:ABORTED), yet the stray holds its net...
    assert world.server("net-a").statuses["nv-1"] == "FINISHED:ABORTED"
    world.clock.advance(abort.RUN_START_WINDOW_S - 1)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    other = world.enqueue("next", net="net-a")
    assert dispatch.assign_jobs(world.rt) == []
    assert world.job(other).state == JobState.QUEUED
    # ...until the window has passed and the server still says it is over.
    world.clock.advance(1)
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert _strays(world) == []
    assert [c.job_id for c in dispatch.assign_jobs(world.rt)] == [other]


def test_a_job_that_was_only_submitted_is_held_the_same(world):
    _aborted_while_starting(world, "SUBMITTED")
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW


def test_a_run_the_runner_started_over_the_mark_is_aborted_again(world):
    _aborted_while_starting(world)
    world.server("net-a").statuses["nv-1"] = "RUNNING"  # the runner overwrote the mark
    world.clock.advance(abort.RUN_START_WINDOW_S)
    abort.settle_stray_runs(world.rt, "net-a")
    assert world.server("net-a").aborted == ["nv-1", "nv-1"]
    assert world.server("net-a").statuses["nv-1"] == "FINISHED:ABORTED"
    assert _strays(world) == []  # the second abort hit a RUNNING run: proof once over


def test_a_repeated_answer_before_start_pushes_the_window_on(world):
    _aborted_while_starting(world)
    world.clock.advance(30)
    world.server("net-a").statuses["nv-1"] = "SUBMITTED"  # the runner set it back again
    held_for_one_window(world)  # from this second answer, not the first


def test_an_earlier_window_never_shortens_a_later_one(world):
    job_id = _aborted_while_starting(world)
    [stray] = _strays(world)
    later = stray.settle_after
    world.clock.advance(-10)
    _record_nv1_again(world, job_id, "again")
    [stray] = _strays(world)
    assert stray.settle_after == later


def test_a_window_given_to_a_stray_recorded_without_one_holds_it(world):
    """A run first recorded with no window (an unconfirmed abort), then answered "aborted
    before it started": the same stray takes the window and is not settled before it ends."""
    job_id = world.enqueue("j", net="net-a")
    world.add_stray(job_id, "net-a", "nv-1")
    _record_nv1_again(world, job_id, "aborted before start")
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW


def test_a_window_pushed_meanwhile_by_another_round_is_kept(world):
    """Two settle rounds at once (a kick and beat's): the later window either of them set
    stands, never the earlier one this round read."""
    _aborted_while_starting(world)
    admin = world.admin("net-a")
    real = admin.abort
    far = world.clock() + 3 * WINDOW

    def abort_while_another_round_pushes(run_id: str):
        with unit_of_work(world.rt.sessions) as session:
            [stray] = session.scalars(select(StrayRun)).all()
            stray.settle_after = far
        return real(run_id)

    admin.abort = abort_while_another_round_pushes  # type: ignore[method-assign]
    world.clock.advance(abort.RUN_START_WINDOW_S)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    [stray] = _strays(world)
    assert stray.settle_after == far

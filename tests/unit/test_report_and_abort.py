"""What an abort request decides (the state the caller is told, and whether the server must
be told too), what flip-api's report leaves behind (its words in the job's history, a run
still going kept as a stray that names it, nothing for a run that is over), and when a
scale-down counts as confirmed."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.adapters.drivers.base import Observation
from app.errors import DriverTransientError
from app.schemas import ReportedStatus, ReportJobStatus
from app.usecases import abort, dispatch, intake, monitor, records, scaling, views
from app.usecases.records import AbortDecision
from models import JobState, NetState, StrayRun


def _strays(world):
    with world.rt.sessions() as session:
        return [
            (s.job_id, s.nvflare_job_id, s.submit_token, s.reason)
            for s in session.scalars(select(StrayRun))
        ]


def _abort(world, job_id) -> AbortDecision:
    with world.rt.sessions.begin() as session:
        return records.abort_job(session, job_id, "user", world.clock())


def test_aborting_a_running_job_asks_the_server_and_so_does_asking_again(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    assert _abort(world, job_id) == AbortDecision(job_id, JobState.ABORTING, True)
    assert _abort(world, job_id) == AbortDecision(job_id, JobState.ABORTING, True)


def test_aborting_a_job_that_is_over_changes_nothing(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_to_completion(job_id)
    assert _abort(world, job_id) == AbortDecision(job_id, JobState.COMPLETED, False)


def test_a_stop_reported_for_a_dispatching_job_shows_flip_apis_words(world):
    job_id = world.stuck_in_dispatching("j")
    report = ReportJobStatus(job_id=job_id, status=ReportedStatus.STOPPED, detail="by the user")
    assert intake.report_status(world.rt, report) == JobState.ABORTING
    with world.rt.sessions() as session:
        last = views.job_detail(session, job_id).history[-1]
    assert (last.to_state, last.reason) == (
        "ABORTING",
        "flip-api reported stopped: by the user",
    )


def test_a_report_for_a_running_job_keeps_its_run_as_a_stray_that_names_it(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    report = ReportJobStatus(job_id=job_id, status=ReportedStatus.ERROR, detail="upload failed")
    assert intake.report_status(world.rt, report) == JobState.FAILED
    assert _strays(world) == [
        (job_id, "nv-1", f"{job_id}-0", "flip-api reported error: upload failed")
    ]


def test_a_report_for_a_run_held_for_it_leaves_nothing_to_settle(held_for_report):
    world = held_for_report
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.FINISHING
    report = ReportJobStatus(job_id=job_id, status=ReportedStatus.RESULTS_UPLOADED)
    assert intake.report_status(world.rt, report) == JobState.COMPLETED
    assert _strays(world) == []
    following = world.enqueue("next", net="net-a")
    assert [a.job_id for a in dispatch.claim_and_start(world.rt)] == [following]


def _stopping(world) -> None:
    world.driver("net-a").replicas = 1
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").state = NetState.STOPPING


@pytest.mark.parametrize(
    "left", [Observation(0, 1, 0), Observation(0, 0, 1)], ids=["running", "pending"]
)
def test_a_scale_down_is_confirmed_only_with_nothing_running_or_pending(world, left):
    _stopping(world)
    world.driver("net-a").observe = lambda: left  # type: ignore[method-assign]
    assert not scaling.stop_net(world.rt, "net-a", "idle")
    assert world.net("net-a").state == NetState.STOPPING
    world.driver("net-a").observe = lambda: Observation(0, 0, 0)  # type: ignore[method-assign]
    assert scaling.stop_net(world.rt, "net-a", "idle")
    assert world.net("net-a").state == NetState.STOPPED


def test_a_scale_down_the_driver_could_not_take_is_not_confirmed(world):
    _stopping(world)
    world.driver("net-a").fail_with = DriverTransientError("throttled")
    assert not scaling.stop_net(world.rt, "net-a", "idle")
    assert world.net("net-a").state == NetState.STOPPING


def test_a_report_for_a_running_job_never_puts_the_next_job_beside_its_live_run(world):
    # flip-api says the job is over (its side failed, or the user stopped it) while NVFLARE
    # still runs it: the job ends as reported, and its run is settled before the net is reused.
    from app.schemas import ReportedStatus, ReportJobStatus
    from app.usecases import intake

    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    report = ReportJobStatus(job_id=job_id, status=ReportedStatus.ERROR, detail="upload failed")
    assert intake.report_status(world.rt, report) == JobState.FAILED
    assert world.server("net-a").statuses["nv-1"] == "RUNNING"
    world.enqueue("next", net="net-a")
    assert dispatch.claim_and_start(world.rt) == []  # not beside a run that still goes on
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert world.server("net-a").aborted == ["nv-1"]
    assert [a.net_name for a in dispatch.claim_and_start(world.rt)] == ["net-a"]


@pytest.mark.parametrize("status", list(ReportedStatus))
def test_a_report_on_an_aborting_job_keeps_its_live_run_from_the_next_job(world, status):
    job_id = world.enqueue("first", net="net-a")
    world.run_pipeline(job_id)
    run = world.job(job_id).nvflare_job_id
    intake.request_abort(world.rt, job_id, "user")  # ABORTING; abort_on_server not run yet
    intake.report_status(world.rt, ReportJobStatus(job_id=job_id, status=status))
    assert world.job(job_id).state in (JobState.ABORTED, JobState.COMPLETED, JobState.FAILED)
    abort.abort_on_server(world.rt, job_id)  # late: the job is over, it does nothing

    nxt = world.enqueue("next", net="net-a")
    if world.server("net-a").statuses[run] == "RUNNING":
        # The run is live: it is a stray, and the net takes no job beside it.
        assert dispatch.claim_and_start(world.rt) == []
        assert world.job(nxt).state == JobState.QUEUED
    abort.settle_stray_runs(world.rt, "net-a")
    assert world.server("net-a").statuses[run] != "RUNNING"
    assert [a.job_id for a in dispatch.claim_and_start(world.rt)] == [nxt]


def test_a_report_on_an_aborting_job_asks_for_its_run_to_be_settled(world):
    job_id = world.enqueue("first", net="net-a")
    world.run_pipeline(job_id)
    intake.request_abort(world.rt, job_id, "user")
    world.outbox.sent.clear()
    intake.report_status(
        world.rt, ReportJobStatus(job_id=job_id, status=ReportedStatus.RESULTS_UPLOADED)
    )
    assert ("fl_dispatcher.settle_stray_runs", {"net_name": "net-a"}) in world.outbox.sent


def test_a_report_on_an_aborting_job_whose_submit_is_in_flight_holds_the_net(world):
    """A job is aborted while its submit is on the wire (DISPATCHING -> ABORTING, no run id
    yet), then flip-api reports it `stopped`. The report ends the job at once and records a
    stray known only by its token; the settle_stray_runs it sends asks the server for that
    token, finds nothing yet (the submit has not landed) and drops the stray. The net is free:
    the next job is claimed onto it, and then the first job's submit lands beside it.

    Breaks: "`stopped` for a DISPATCHING job (its submit may be in flight) is an abort:
    ABORTING until the server has been told" and "the net is not handed to the next job
    while this one's run may still land" (records.report_job_status), and the commit's
    item 1 "the net takes no job beside it"."""
    first = world.enqueue("first", net="net-a")
    net, attempt = world.run_until_ready(first)
    server = world.server("net-a")
    claimed: list = []

    def while_the_submit_is_on_the_wire() -> None:
        server.on_submit = None
        intake.request_abort(world.rt, first, "user")  # DISPATCHING -> ABORTING
        intake.report_status(world.rt, ReportJobStatus(job_id=first, status=ReportedStatus.STOPPED))
        abort.settle_stray_runs(world.rt, "net-a")  # the task report_status sent
        world.enqueue("next", net="net-a")
        claimed.extend(dispatch.claim_and_start(world.rt))

    server.on_submit = while_the_submit_is_on_the_wire
    dispatch.dispatch(world.rt, first, net, attempt)
    assert claimed == [], "the net was handed to the next job while the first's submit flew"

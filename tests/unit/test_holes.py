"""One test per hole found in the pipeline's correctness review: a job lost, run twice, or a
server left up. Each drives the real use cases on SQLite with the unit tier's fakes."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app import names
from app.errors import (
    AdminMisconfigured,
    DriverTransientError,
    ServerUnavailable,
    UnknownAdminError,
)
from app.usecases import (
    abort,
    dispatch,
    monitor,
    reconciler,
    scale_down,
    services,
    unknown_submit,
)
from app.usecases.dispatch import Step
from models import JobState, NetState, ReasonCode, StrayRun
from tests.fixtures.db import net_decl


def _strays(world):
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def test_one_net_misconfigured_admin_does_not_stop_monitoring_of_another(world):
    # hole 1: net "fixed" (static, first by name) raises AdminMisconfigured on every probe;
    # the job on net-a must still settle.
    on_fixed = world.enqueue("f", net="fixed")
    world.run_pipeline(on_fixed)
    on_a = world.enqueue("a", net="net-a")
    world.run_pipeline(on_a)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"

    def broken() -> float:
        raise AdminMisconfigured("admin certificate expired")

    world.admin("fixed").server_start_time = broken  # type: ignore[method-assign]
    monitor.monitor_running_jobs(world.rt)
    assert world.job(on_a).state == JobState.COMPLETED
    assert "expired" in (world.net("fixed").last_error or "")


def test_an_unclassified_error_on_one_net_never_escapes_a_housekeeping_loop(world):
    job_id = world.enqueue("a", net="net-a")
    world.run_pipeline(job_id)

    def boom() -> None:
        raise RuntimeError("something nobody classified")

    world.admin("net-a").ping = boom  # type: ignore[method-assign]
    assert scale_down.keep_alive_busy_nets(world.rt) == []
    world.admin("net-a").server_start_time = boom  # type: ignore[method-assign]
    monitor.monitor_running_jobs(world.rt)
    assert "RuntimeError" in (world.net("net-a").last_error or "")


def test_a_busy_net_whose_admin_access_broke_is_settled_after_the_grace(world):
    job_id = world.enqueue("a", net="net-a")
    world.run_pipeline(job_id)

    def broken() -> float:
        raise AdminMisconfigured("admin certificate expired")

    world.admin("net-a").server_start_time = broken  # type: ignore[method-assign]
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING  # inside the grace
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.driver("net-a").replicas == 0  # no server left up


def test_a_stale_chain_step_never_dispatches_the_next_attempt(world):
    # hole 2: attempt 0's chain gives up; the job is claimed again (attempt 1); attempt 0's
    # dispatch step arrives late and must skip.
    job_id = world.enqueue("j", net="net-a", required_sites=["site-9"])
    dispatch.assign_jobs(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    world.clock.advance(121)
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.GAVE_UP
    reconciler.reconcile(world.rt)  # net-a settles to STOPPED
    [again] = dispatch.assign_jobs(world.rt)
    assert again.attempt == 1
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    assert world.job(job_id).state == JobState.ASSIGNED
    assert world.server("net-a").submitted == {}


def test_a_stale_submit_never_goes_out_while_the_next_attempt_is_dispatching(world, monkeypatch):
    # hole 2, later in the step: attempt 0's dispatch is copying its bundle when the job
    # moves on and is DISPATCHING again, on attempt 1 with its own token. Attempt 0's submit
    # must not go out (the same state is not the same attempt).
    job_id = world.enqueue("j", net="net-a")
    world.run_until_ready(job_id)
    real_prepare = dispatch.prepare

    def prepare_while_the_job_moves_on(*args, **kwargs):
        folder = real_prepare(*args, **kwargs)
        with world.rt.sessions.begin() as session:
            services.requeue_job(session, job_id, "moved on", world.clock())
        world.run_until_ready(job_id)
        with world.rt.sessions.begin() as session:
            services.get_job(session, job_id).start_dispatch(world.clock())
        return folder

    monkeypatch.setattr(dispatch, "prepare", prepare_while_the_job_moves_on)
    result = dispatch.dispatch(world.rt, job_id, "net-a", 0)
    assert (result.step, result.detail) == (
        Step.SKIPPED,
        "job moved on while its copy was prepared",
    )
    assert world.server("net-a").submitted == {}
    job = world.job(job_id)
    assert (job.state, job.attempts, job.submit_token) == (
        JobState.DISPATCHING,
        1,
        f"{job_id}-1",
    )


def test_a_run_the_server_forgot_is_lost_not_running_forever(world):
    # hole 3 (second half)
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses.clear()
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED


def test_status_errors_do_not_switch_off_the_run_time_limit(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)

    def unknown(_: str):
        raise UnknownAdminError("odd reply")

    world.admin("net-a").job_status = unknown  # type: ignore[method-assign]
    world.clock.advance(world.rt.settings.max_run_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.FAILED


def test_retries_exhausted_on_an_unknown_submit_never_start_a_second_run(world):
    # hole 4: the submit landed, the reply was lost, the task ran out of retries.
    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    server = world.server("net-a")

    def landed_then_lost() -> None:
        token = f"{job_id}-0"
        server.submitted[token] = "nv-1"
        server.statuses["nv-1"] = "RUNNING"
        raise ServerUnavailable("reply lost")

    server.on_submit = landed_then_lost
    with pytest.raises(ServerUnavailable):
        dispatch.dispatch(world.rt, job_id, "net-a", 0)
    assert not dispatch.requeue_after_transient(
        world.rt, job_id, "dispatch: retries exhausted", net_name="net-a", attempt=0
    )
    assert world.job(job_id).state == JobState.DISPATCHING  # the attempt is not abandoned
    server.on_submit = None
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.DONE  # adopts it
    assert world.job(job_id).nvflare_job_id == "nv-1"
    assert len(server.submitted) == 1


def _unknown_submit(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    world.server("net-a").submit_error = ServerUnavailable("no reply")
    with pytest.raises(ServerUnavailable):
        dispatch.dispatch(world.rt, job_id, "net-a", 0)
    world.server("net-a").submit_error = None
    world.clock.advance(dispatch.submit_try_s(world.rt.settings) + 1)  # its holder is gone
    return job_id


def test_an_abandoned_submit_the_server_never_got_is_requeued_with_the_server_kept(world):
    job_id = _unknown_submit(world)
    assert unknown_submit.abandon_dispatch(world.rt, job_id, "submit outcome unknown")
    assert world.job(job_id).state == JobState.QUEUED
    assert world.driver("net-a").replicas == 1  # the server said the token has no run
    assert _strays(world) == []


def test_an_abandoned_submit_that_landed_is_adopted_not_run_again(world):
    job_id = _unknown_submit(world)
    server = world.server("net-a")
    server.submitted[f"{job_id}-0"] = "nv-7"  # it had landed; only the reply was lost
    server.statuses["nv-7"] = "RUNNING"
    assert not unknown_submit.abandon_dispatch(world.rt, job_id, "submit outcome unknown")
    job = world.job(job_id)
    assert (job.state, job.nvflare_job_id) == (JobState.RUNNING, "nv-7")


def test_an_abandoned_submit_on_a_silent_server_takes_it_down_before_the_job_runs_again(world):
    job_id = _unknown_submit(world)
    world.server("net-a").up = False  # the admin side cannot reach it; the replica still runs
    assert unknown_submit.abandon_dispatch(world.rt, job_id, "submit outcome unknown")
    assert world.job(job_id).state == JobState.QUEUED
    assert world.driver("net-a").replicas == 0
    assert _strays(world) == []  # settled by the server going away


def test_a_lost_server_on_a_scale_to_zero_net_is_taken_down_before_the_requeue_runs(world):
    # hole 5: only the admin side lost the server; the first run may still be going.
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False
    monitor.monitor_running_jobs(world.rt)
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED
    assert world.driver("net-a").calls[-1] == 0  # the old run dies with its server


def test_a_submit_that_lands_after_flip_api_ended_the_job_is_aborted(world):
    # hole 6
    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    server = world.server("net-a")

    def flip_api_reports_error() -> None:
        with world.rt.sessions.begin() as session:
            services.finish_job(
                session,
                job_id,
                JobState.FAILED,
                "flip-api: error",
                world.clock(),
                code=ReasonCode.REPORTED_ERROR,
            )

    server.on_submit = flip_api_reports_error
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    assert (names.SETTLE_STRAY_RUNS, {"net_name": "net-a"}) in world.outbox.sent
    assert len(_strays(world)) == 1
    assert dispatch.assign_jobs(world.rt) == []  # net-a takes no job while it is unsettled
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert server.aborted == ["nv-1"]


def test_reconcile_never_stops_a_net_under_a_job_claimed_meanwhile(world):
    # hole 7: drift (a server up while STOPPED) and a job claimed before reconcile decides.
    world.driver("net-a").replicas = 1
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)  # the net is STARTING with a job now
    reconciler.reconcile(world.rt)
    assert world.driver("net-a").replicas == 1
    assert world.job(job_id).state == JobState.ASSIGNED


@pytest.mark.parametrize("state", list(NetState))
@pytest.mark.parametrize("to_always_on", [True, False])
def test_a_flag_change_across_a_redeploy_is_legal_from_every_net_state(
    tmp_path, job_root, sqlite_factory, clock, state, to_always_on
):
    # hole 8: PER_JOB_FL_SERVER flipped while the net was in any state.
    import json

    from app.settings import Settings
    from tests.unit.conftest import World

    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "net-a", "ecs")]),
        PER_JOB_FL_SERVER="false" if to_always_on else "true",
    )
    world = World(settings, sqlite_factory, clock)
    with world.rt.sessions.begin() as session:
        session.get(type(world.net("net-a")), "net-a").state = state
    world.driver("net-a").replicas = 1 if state in (NetState.READY, NetState.BUSY) else 0
    for _ in range(3):
        world.clock.advance(world.rt.settings.stuck_after_s + 1)
        reconciler.reconcile(world.rt)  # must not raise, whatever the state
    final = world.net("net-a").state
    if state == NetState.MISCONFIGURED:
        assert final == NetState.MISCONFIGURED
    elif to_always_on:
        assert final in (NetState.READY, NetState.OUTAGE, NetState.BUSY)
    else:
        assert final in (NetState.STOPPED, NetState.READY, NetState.BUSY)


def test_a_misconfigured_net_whose_scale_down_failed_is_scaled_down_later(world):
    # hole 9
    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    driver = world.driver("net-a")
    real_scale = driver.scale

    def throttled(replicas: int) -> None:
        raise DriverTransientError("throttled")

    driver.scale = throttled  # type: ignore[method-assign]

    def wrong_ca(sites):
        raise AdminMisconfigured("kit signed by another CA")

    world.admin("net-a").is_ready = wrong_ca  # type: ignore[method-assign]
    with pytest.raises(AdminMisconfigured):
        dispatch.check_ready(world.rt, job_id, "net-a", 0)
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.job(job_id).attempts == 0  # not the job's fault: no attempt burnt
    driver.scale = real_scale  # type: ignore[method-assign]
    assert driver.replicas == 1
    reconciler.reconcile(world.rt)
    assert driver.replicas == 0


def test_aborting_ends_within_the_abort_timeout_and_takes_the_server_down(world):
    # hole 10
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)

    def unknown(_: str):
        raise UnknownAdminError("odd reply")

    world.admin("net-a").abort = unknown  # type: ignore[method-assign]
    assert world.abort(job_id) == JobState.ABORTING
    world.clock.advance(world.rt.settings.abort_timeout_s + 1)
    reconciler.reconcile(world.rt)
    job = world.job(job_id)
    assert (job.state == JobState.ABORTED and "not confirmed" in (job.last_error or "")) or (
        job.state == JobState.ABORTED
    )
    assert world.driver("net-a").replicas == 0
    assert world.net("net-a").state == NetState.STOPPED


def test_a_late_readiness_check_never_flips_a_busy_net_back_to_ready(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    assert world.net("net-a").state == NetState.BUSY


def test_results_reported_for_a_job_that_has_not_run_is_refused_plainly(world):
    from app.errors import InvalidRequest
    from app.schemas import ReportedStatus, ReportJobStatus

    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)
    report = ReportJobStatus(job_id=job_id, status=ReportedStatus.RESULTS_UPLOADED)
    with world.rt.sessions.begin() as session, pytest.raises(InvalidRequest):
        services.report_job_status(session, report, world.clock())
    assert world.job(job_id).state == JobState.ASSIGNED


def test_an_abort_the_server_did_not_hear_leaves_a_stray_run_not_a_second_job_beside_it(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False  # a blip: the admin side cannot reach the server
    assert world.abort(job_id) == JobState.ABORTED  # no error reaches the caller
    assert [s.nvflare_job_id for s in _strays(world)] == ["nv-1"]
    world.enqueue("next", net="net-a")
    assert dispatch.assign_jobs(world.rt) == []  # not beside a run that may still go on
    world.server("net-a").up = True
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert world.server("net-a").aborted == ["nv-1"]
    assert [a.net_name for a in dispatch.assign_jobs(world.rt)] == ["net-a"]


def test_a_job_whose_old_run_is_unsettled_waits_for_it(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False
    world.driver("net-a").fail_with = DriverTransientError("throttled")  # cannot take it down
    monitor.monitor_running_jobs(world.rt)
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED
    assert len(_strays(world)) == 1
    assert dispatch.assign_jobs(world.rt) == []  # one live run per job, even on another net
    world.driver("net-a").fail_with = None
    world.driver("net-a").replicas = 0  # the platform finally stopped it
    reconciler.reconcile(world.rt)
    assert _strays(world) == []


def test_reconcile_finding_a_starting_net_misconfigured_requeues_its_assigned_job(world):
    # simulator seed 548 (chaos): the chain's wait_ready message was lost, reconcile found the
    # net's service gone and marked it MISCONFIGURED with the job still ASSIGNED to it; a
    # worker restart then reset the net to STOPPED under the job.
    from app.errors import DriverMisconfigured

    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)
    assert dispatch.scale_up(world.rt, job_id, "net-a", 0).step == Step.DONE
    world.driver("net-a").fail_with = DriverMisconfigured("service not found")
    world.clock.advance(world.rt.settings.stuck_after_s + 1)  # its chain is long gone
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.MISCONFIGURED
    job = world.job(job_id)
    assert (job.state, job.net_name, job.attempts) == (JobState.QUEUED, None, 0)


def test_a_restart_never_resets_a_misconfigured_net_to_stopped_under_a_job(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:  # however it came to be marked
        services.get_net(session, "net-a").transition(NetState.MISCONFIGURED, world.clock(), "x")
        services.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.job(job_id).state == JobState.RUNNING


def test_a_stray_the_server_cannot_settle_takes_an_idle_scale_to_zero_net_down(world):
    # simulator seeds 139/143: a stray whose status the server cannot give stayed unsettled
    # for ever, and the job waiting for the net with it starved.
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False  # a blip while the abort goes out: kept as a stray
    assert world.abort(job_id) == JobState.ABORTED
    world.server("net-a").up = True

    def unreadable(_: str):
        raise UnknownAdminError("job has no status")

    world.admin("net-a").job_status = unreadable  # type: ignore[method-assign]
    waiting = world.enqueue("next", net="net-a")
    reconciler.reconcile(world.rt)
    assert len(_strays(world)) == 1 and world.driver("net-a").replicas == 1  # not yet
    world.clock.advance(world.rt.settings.abort_timeout_s + 1)
    reconciler.reconcile(world.rt)
    assert _strays(world) == [] and world.driver("net-a").replicas == 0
    assert [a.job_id for a in dispatch.assign_jobs(world.rt)] == [waiting]


def test_an_always_on_net_found_at_zero_replicas_releases_the_job_waiting_on_its_stray(
    tmp_path, job_root, sqlite_factory, clock
):
    # simulator seed 476 (chaos): an always-on net scaled to 0 by hand while its job ran; the
    # job was requeued with its run kept as a stray, and waited for ever although the run had
    # died with the server and another net was free.
    from tests.unit.conftest import world_of

    nets = [
        net_decl(tmp_path, "always", "ecs", per_job_fl_server=False),
        net_decl(tmp_path, "net-b", "ecs"),
    ]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    world.driver("always").replicas = 1
    reconciler.reconcile(world.rt)  # READY
    job_id = world.enqueue("j", required_sites=["site-1", "site-2"])
    world.run_pipeline(job_id)
    assert world.job(job_id).net_name == "always"
    world.driver("always").replicas = 0  # by hand: the server and its run are gone
    world.server("always").up = False
    monitor.monitor_running_jobs(world.rt)
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED and len(_strays(world)) == 1
    assert dispatch.assign_jobs(world.rt) == []  # its own run may still go on: it waits
    reconciler.reconcile(world.rt)
    assert _strays(world) == []
    assert [a.net_name for a in dispatch.assign_jobs(world.rt)] == ["net-b"]


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
    assert dispatch.assign_jobs(world.rt) == []  # not beside a run that still goes on
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert world.server("net-a").aborted == ["nv-1"]
    assert [a.net_name for a in dispatch.assign_jobs(world.rt)] == ["net-a"]

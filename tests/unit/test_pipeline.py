"""Pipeline and housekeeping branches with fake adapters on an embedded database."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.errors import DriverMisconfigured, ServerUnavailable
from app.usecases import abort, dispatch, monitor, reconciler, retries, scale_down
from app.usecases.dispatch import Step
from models import JobState, NetState, ScaleEvent


def test_cold_start_run_and_scale_to_zero(world):
    job_id = world.enqueue("j1", net="net-a")
    claimed = dispatch.claim_and_start(world.rt)
    assert [(a.job_id, a.net_name) for a in claimed] == [(job_id, "net-a")]
    assert world.outbox.sent == [
        ("pipeline", {"job_id": str(job_id), "net_name": "net-a", "attempt": 0})
    ]
    assert world.net("net-a").state == NetState.STARTING

    assert dispatch.scale_up(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert world.driver("net-a").calls == [1]
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert world.net("net-a").state == NetState.READY
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.DONE
    job = world.job(job_id)
    assert (job.state, job.nvflare_job_id, job.submit_token) == (
        JobState.RUNNING,
        "nv-1",
        f"{job_id}-0",
    )
    assert world.net("net-a").state == NetState.BUSY

    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.COMPLETED
    assert world.net("net-a").state == NetState.READY

    world.clock.advance(59)
    assert scale_down.scale_down_idle_nets(world.rt) == []
    world.clock.advance(2)
    assert scale_down.scale_down_idle_nets(world.rt) == ["net-a"]
    assert world.net("net-a").state == NetState.STOPPED
    assert world.driver("net-a").calls == [1, 0]
    with world.rt.sessions() as session:
        outcomes = [(e.action, e.outcome) for e in session.scalars(select(ScaleEvent))]
    assert outcomes == [("scale_up", "ok"), ("scale_down", "ok")]


def test_second_job_brings_the_server_back_with_a_fresh_admin_session(world):
    first = world.enqueue("j1", net="net-a")
    world.run_pipeline(first)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    old_admin = world.admin("net-a")
    world.clock.advance(61)
    scale_down.scale_down_idle_nets(world.rt)
    assert old_admin.closed == 1  # the admin client was dropped with the server

    second = world.enqueue("j2", net="net-a")
    world.run_pipeline(second)
    assert world.admin("net-a") is not old_admin
    assert world.job(second).state == JobState.RUNNING


def test_back_to_back_jobs_reuse_the_warm_net(world):
    first = world.enqueue("j1", net="net-a")
    second = world.enqueue("j2", net="net-a")
    world.run_pipeline(first)
    assert dispatch.claim_and_start(world.rt) == []  # the net is busy
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    world.run_pipeline(second)
    assert world.driver("net-a").calls == [1]  # one scale-up for both jobs
    assert world.job(second).state == JobState.RUNNING


def test_not_ready_then_deadline_requeues_and_marks_unhealthy(world):
    job_id = world.enqueue("j1", net="net-a")
    world.server("net-a").up = False  # the server process never answers
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    result = dispatch.check_ready(world.rt, job_id, "net-a", 0)
    assert result.step == Step.NOT_READY and "down" in result.detail
    world.clock.advance(121)
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.GAVE_UP
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 1)
    assert world.net("net-a").state == NetState.UNHEALTHY
    assert world.driver("net-a").calls == [1, 0]
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STOPPED


def test_transient_submit_failure_keeps_the_token_and_never_runs_twice(world):
    job_id = world.enqueue("j1", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    admin = world.server("net-a")
    admin.submit_error = ServerUnavailable("connection reset")
    with pytest.raises(ServerUnavailable):
        dispatch.dispatch(world.rt, job_id, "net-a", 0)
    job = world.job(job_id)
    assert (job.state, job.submit_token) == (JobState.DISPATCHING, f"{job_id}-0")
    admin.submit_error = None
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.SKIPPED  # redelivered
    assert admin.submitted == {f"{job_id}-0": "nv-1"}


def test_retries_exhausted_requeues_and_never_deletes(world):
    job_id = world.enqueue("j1", net="net-a")
    dispatch.claim_and_start(world.rt)
    assert retries.requeue_after_transient(
        world.rt, job_id, "dispatch: retries exhausted", net_name="net-a", attempt=0
    )
    job = world.job(job_id)
    assert (job.state, job.attempts, job.net_name) == (JobState.QUEUED, 1, None)
    assert ("fl_dispatcher.assign_next_job", {}) in world.outbox.sent


def test_misconfigured_driver_fails_loud_and_requeues(world):
    job_id = world.enqueue("j1", net="net-a")
    dispatch.claim_and_start(world.rt)
    world.driver("net-a").fail_with = DriverMisconfigured("service fl-server-net-a MISSING")
    with pytest.raises(DriverMisconfigured):
        dispatch.scale_up(world.rt, job_id, "net-a", 0)
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.job(job_id).state == JobState.QUEUED
    assert dispatch.claim_and_start(world.rt) == []  # never assigned to a misconfigured net


def test_abort_in_every_phase(world):
    queued = world.enqueue("q", net="net-a", priority=-1)
    assert world.abort(queued, "user") == JobState.ABORTED

    scaling = world.enqueue("s", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, scaling, "net-a", 0)
    assert world.abort(scaling, "user") == JobState.ABORTED
    assert dispatch.check_ready(world.rt, scaling, "net-a", 0).step == Step.SKIPPED
    assert dispatch.dispatch(world.rt, scaling, "net-a", 0).step == Step.SKIPPED

    running = world.enqueue("r", net="net-a")
    world.run_pipeline(running)
    assert world.abort(running, "user") == JobState.ABORTED
    assert world.server("net-a").aborted == ["nv-1"]
    assert world.net("net-a").state == NetState.READY
    # "A server that is down means nothing to abort" is the real admin client's answer:
    # pinned against a real server in tests/integration/test_nvflare_admin.py and e2e.


def test_abort_while_submit_in_flight_aborts_the_run_when_it_lands(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    # flip-api's abort arrives while the submit is on the wire.
    world.server("net-a").on_submit = lambda: world.abort(job_id, "user")
    dispatch.dispatch(world.rt, job_id, "net-a", 0)
    assert world.job(job_id).state == JobState.ABORTING
    assert ("fl_dispatcher.abort_on_server", {"job_id": str(job_id)}) in world.outbox.sent
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED


def test_server_restart_under_a_job_requeues_it(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").restart(2000.0)  # restarted
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "requeued"}
    assert world.job(job_id).state == JobState.QUEUED


def test_a_monitor_round_that_outlived_its_snapshot_leaves_the_next_attempt_alone(world):
    """Monitor rounds overlap (a call to a dead server waits its timeout): a round that read
    the job RUNNING on the old server must not requeue its next attempt when it finally sees
    the new server (seen in tests/e2e/test_faults.py: an attempt wasted per server crash)."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    server = world.server("net-a")

    def meanwhile() -> None:  # while the slow round waits, another settles and restarts it
        server.restart(2000.0)
        assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "requeued"}
        assert abort.settle_stray_runs(world.rt, "net-a") == 0  # the settle it sent
        world.run_pipeline(job_id)

    server.on_start_time = meanwhile
    outcome = monitor.monitor_running_jobs(world.rt)[str(job_id)]
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.RUNNING, 1), outcome
    assert outcome == monitor.STALE


def test_server_gone_waits_the_grace_then_applies_the_policy(world, monkeypatch):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False
    assert "not answering" in monitor.monitor_running_jobs(world.rt)[str(job_id)]
    world.clock.advance(31)
    assert "not answering" in monitor.monitor_running_jobs(world.rt)[str(job_id)]  # 2 rounds
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "requeued"}


def test_lost_policy_fail(world):
    world.rt.settings = world.rt.settings.model_copy(update={"lost_job_policy": "fail"})
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:ABNORMAL"
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "failed"}


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("FINISHED:COMPLETED", JobState.COMPLETED),
        ("FINISHED:ABORTED", JobState.ABORTED),
        ("FINISHED:EXECUTION_EXCEPTION", JobState.FAILED),
        ("FINISHED:FAILED_TO_RUN", JobState.FAILED),
        ("FINISHED:CAN_NOT_SCHEDULE", JobState.FAILED),
        ("FINISHED:ABANDONED", JobState.QUEUED),
        ("SUBMITTED", JobState.RUNNING),
        ("RUNNING", JobState.RUNNING),
    ],
)
def test_monitor_maps_nvflare_status(world, status, state):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = status
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == state


def test_idle_net_is_kept_while_a_job_waits_for_it(world):
    first = world.enqueue("j1", net="net-a")
    world.run_pipeline(first)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    world.enqueue("j2", net="net-a")
    world.clock.advance(600)
    assert scale_down.scale_down_idle_nets(world.rt) == []
    assert world.net("net-a").state == NetState.READY


def test_keep_alive_pings_only_busy_nets(world):
    assert scale_down.keep_alive_busy_nets(world.rt) == []
    assert world.admins_built == []  # no admin client was even built for idle nets
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    assert scale_down.keep_alive_busy_nets(world.rt) == ["net-a"]
    assert world.server("net-a").pings == 1
    assert "fixed" not in {name for name, _ in world.admins_built}


def test_always_on_net_is_never_scaled_and_reports_outage(world):
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    assert world.driver("fixed").calls == []
    world.server("fixed").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    world.clock.advance(10_000)
    assert scale_down.scale_down_idle_nets(world.rt) == []
    world.server("fixed").up = False
    reconciler.reconcile(world.rt)
    assert world.net("fixed").state == NetState.OUTAGE
    world.server("fixed").up = True
    reconciler.reconcile(world.rt)
    assert world.net("fixed").state == NetState.READY
    assert world.driver("fixed").calls == []


def test_reconcile_requeues_a_job_whose_chain_was_lost(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)  # the chain message is "lost": nothing runs it
    world.clock.advance(120 + world.rt.settings.stuck_after_s + 1)
    result = reconciler.reconcile(world.rt)
    assert f"{job_id}: requeued" in result.redriven
    assert world.job(job_id).state == JobState.QUEUED


def test_reconcile_redrives_a_stuck_dispatch(world):
    job_id = world.stuck_in_dispatching("j")
    # Not while a worker still holds the submit: a retry announced its next try.
    retries.count_retry(world.rt, job_id, next_try_in_s=60)
    due_s = 60 + retries.submit_try_s(world.rt.settings)
    world.clock.advance(due_s)
    reconciler.reconcile(world.rt)
    sent = ("fl_dispatcher.dispatch", {"job_id": str(job_id), "net_name": "net-a", "attempt": 0})
    assert sent not in world.outbox.sent
    world.clock.advance(1)
    reconciler.reconcile(world.rt)
    assert sent in world.outbox.sent


def test_reconcile_repairs_drift(world):
    world.driver("net-a").replicas = 1  # a server runs although the net is STOPPED
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    result = reconciler.reconcile(world.rt)
    assert any("drift" in r for r in result.repaired)
    assert world.driver("net-a").replicas == 0


def test_reconcile_redrives_a_starting_net_whose_chain_was_lost_before_scale_up(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)  # claimed; the chain message is lost before scale_up
    world.outbox.sent.clear()
    world.clock.advance(world.rt.settings.stuck_after_s - 1)
    assert not any("re-driven" in r for r in reconciler.reconcile(world.rt).repaired)
    world.clock.advance(2)
    result = reconciler.reconcile(world.rt)
    assert any("re-driven" in r for r in result.repaired)
    assert ("pipeline", {"job_id": str(job_id), "net_name": "net-a", "attempt": 0}) in (
        world.outbox.sent
    )
    dispatch.scale_up(world.rt, job_id, "net-a", 0)  # the re-driven chain runs
    world.outbox.sent.clear()
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    assert not any("re-driven" in r for r in reconciler.reconcile(world.rt).repaired)


def test_a_run_past_its_maximum_time_is_aborted_on_the_server_and_failed(world):
    world.rt.settings = world.rt.settings.model_copy(update={"max_run_s": 3600.0})
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.clock.advance(3599)
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "running"}
    world.clock.advance(2)
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "failed: overran"}
    job = world.job(job_id)
    assert job.state == JobState.FAILED and "maximum run time" in job.last_error
    assert world.server("net-a").aborted == ["nv-1"]
    assert world.net("net-a").state == NetState.READY

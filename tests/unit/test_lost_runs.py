"""A run whose server was lost: an ABORTING job is simply ABORTED, others follow
LOST_JOB_POLICY (requeue, or FAILED once the attempts are used up); a run that may still be
alive (only the admin side lost the server) is kept as a stray run until it is settled."""

from __future__ import annotations

from sqlalchemy import select

from app.errors import AdminMisconfigured, DriverTransientError, ServerUnavailable
from app.schemas import EnqueueJob
from app.usecases import abort, dispatch, enqueue, intake, monitor, reconciler
from models import JobEvent, JobState, NetState, StrayRun
from tests.unit.scale_history import scale_decisions


def _strays(world):
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def _last_reason(world, job_id) -> str:
    with world.rt.sessions() as session:
        return session.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).all()[-1].reason


def _unreachable(world, net: str, exc: Exception) -> None:
    def broken() -> float:
        raise exc

    world.admin(net).server_start_time = broken  # type: ignore[method-assign]


def test_an_aborting_job_whose_server_restarted_is_aborted(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)

    def unconfirmed(_: str):
        raise ServerUnavailable("down")

    world.admin("net-a").abort = unconfirmed  # type: ignore[method-assign]
    intake.request_abort(world.rt, job_id, "user")
    world.server("net-a").restart(2000.0)  # restarted: the run died with it
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "aborted"}
    assert world.job(job_id).state == JobState.ABORTED
    assert _last_reason(world, job_id) == "server restarted under the job"
    # Its run is kept until the server says it is over: "not running", as nvflare 2.9
    # answers for a run killed with an earlier process.
    assert [s.nvflare_job_id for s in _strays(world)] == ["nv-1"]
    del world.admin("net-a").abort
    assert abort.settle_stray_runs(world.rt, "net-a") == 0


def test_a_lost_run_on_its_last_attempt_fails_the_job(world):
    world.clock.advance(1)
    with world.rt.sessions.begin() as session:
        job_id = enqueue.enqueue_job(
            session,
            world.rt.settings,
            EnqueueJob(caller_key="last", definition="tiny-job", net="net-a", max_attempts=1),
            world.clock(),
        ).job_id
    world.run_pipeline(job_id)
    world.server("net-a").restart(2000.0)
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "failed"}
    job = world.job(job_id)
    assert job.state == JobState.FAILED
    assert "server restarted under the job" in (job.last_error or "")


def test_a_run_lost_with_the_fail_policy_fails_with_the_reason(world):
    world.rt.settings = world.rt.settings.model_copy(update={"lost_job_policy": "fail"})
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").restart(2000.0)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).last_error == "server restarted under the job"


def test_a_long_monitor_error_is_kept_on_the_net_cut_to_2000_characters(world):
    """As housekeeping's own failures (`isolated`): a bounded text for /fl/status and the CLI."""
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    _unreachable(world, "fixed", ServerUnavailable("x" * 3000))
    monitor.monitor_running_jobs(world.rt)
    assert world.net("fixed").last_error == ("monitor: " + "x" * 3000)[:2000]


def test_a_silent_always_on_server_keeps_its_run_as_a_stray_past_the_grace(world):
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    _unreachable(world, "fixed", ServerUnavailable("no route"))
    first = monitor.monitor_running_jobs(world.rt)
    assert first[str(job_id)].startswith("server not answering for 0s")
    assert world.net("fixed").last_error == "monitor: no route"
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(world.rt.settings.server_lost_grace_s)  # exactly the grace: lost
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "requeued"}
    [stray] = _strays(world)
    assert (stray.net_name, stray.job_id, stray.nvflare_job_id) == ("fixed", job_id, "nv-1")
    assert (
        stray.reason
        == f"server not answering for {world.rt.settings.server_lost_grace_s:.0f}s: no route"
    )
    assert world.job(job_id).state == JobState.QUEUED


def test_a_busy_net_whose_admin_access_is_misconfigured_says_so_past_the_grace(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    _unreachable(world, "net-a", AdminMisconfigured("admin certificate expired"))
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    net = world.net("net-a")
    assert net.state == NetState.MISCONFIGURED
    assert net.last_error == "admin access failed on a busy net: admin certificate expired"


def test_a_server_whose_admin_access_is_misconfigured_is_asked_nothing_more_that_round(world):
    # Every further call would be one more refused login on the round's clock, and none
    # could read a run's status.
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    _unreachable(world, "net-a", AdminMisconfigured("admin certificate expired"))
    admin = world.admin("net-a")
    real_job_status = admin.job_status
    asked: list[str] = []

    def job_status(run: str):
        asked.append(run)
        return real_job_status(run)

    admin.job_status = job_status  # type: ignore[method-assign]
    assert monitor.monitor_running_jobs(world.rt) == {
        str(job_id): "server not answering for 0s: admin certificate expired"
    }
    assert asked == []


def test_a_run_lost_on_a_silent_scale_to_zero_server_dies_with_it(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    _unreachable(world, "net-a", ServerUnavailable("no route"))
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(world.rt.settings.server_lost_grace_s)
    monitor.monitor_running_jobs(world.rt)
    grace = f"{world.rt.settings.server_lost_grace_s:.0f}s"
    assert scale_decisions(world, "net-a")[-1] == (
        0,
        f"run of job {job_id} lost: server not answering for {grace}: no route",
    )
    assert _strays(world) == []  # gone with the server


def test_a_busy_net_whose_admin_access_broke_is_settled_after_the_grace(world):
    job_id = world.enqueue("a", net="net-a")
    world.run_pipeline(job_id)

    def broken() -> float:
        raise AdminMisconfigured("admin certificate expired")

    world.admin("net-a").server_start_time = broken  # type: ignore[method-assign]
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING  # inside the grace
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.driver("net-a").replicas == 0  # no server left up


def test_a_lost_server_on_a_scale_to_zero_net_is_taken_down_before_the_requeue_runs(world):
    # tests/sim/FINDINGS.md, hole 5: only the admin side lost the server; the first run may
    # still be going.
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED
    assert world.driver("net-a").calls[-1] == 0  # the old run dies with its server


def test_a_job_whose_old_run_is_unsettled_waits_for_it(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False
    world.driver("net-a").fail_with = DriverTransientError("throttled")  # cannot take it down
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED
    assert len(_strays(world)) == 1
    assert dispatch.claim_and_start(world.rt) == []  # one live run per job, even on another net
    world.driver("net-a").fail_with = None
    world.driver("net-a").replicas = 0  # the platform finally stopped it
    reconciler.reconcile(world.rt)
    assert _strays(world) == []


def test_two_failed_rounds_the_grace_apart_lose_no_run(world):
    # Simulator seed 6634: the server failed one round's calls, no round ran for the grace
    # (a sparse beat), the next round's calls failed too; the run had completed meanwhile
    # and was queued to run again. Lost takes SERVER_LOST_ROUNDS failed rounds in a row.
    assert world.rt.settings.server_lost_rounds == 3
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    _unreachable(world, "net-a", ServerUnavailable("no route"))
    monitor.monitor_running_jobs(world.rt)
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    second = monitor.monitor_running_jobs(world.rt)
    assert second[str(job_id)].startswith("server not answering for ")
    assert world.job(job_id).state == JobState.RUNNING
    assert world.net("net-a").unreachable_rounds == 2
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "requeued"}


def test_an_answer_between_failed_rounds_restarts_the_count(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    admin = world.admin("net-a")
    _unreachable(world, "net-a", ServerUnavailable("no route"))
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)
    del admin.server_start_time  # answers again
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "running"}
    assert (world.net("net-a").unreachable_since, world.net("net-a").unreachable_rounds) == (
        None,
        0,
    )
    _unreachable(world, "net-a", ServerUnavailable("no route"))
    monitor.monitor_running_jobs(world.rt)
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING  # two rounds since the answer

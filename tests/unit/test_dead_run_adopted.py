"""A run killed with its server process reads RUNNING for ever in NVFLARE 2.9. When a
re-sent submit's token is answered, on the new process, with that dead run, the dispatcher
records the new process's start time, so no restart is ever seen: the run's own start time
(the job store's) is what says it ran on an earlier process. Found by the 10,000-seed sweep
(seeds 3894, 7305, 9969): the job read RUNNING until MAX_RUN_S, holding its server a day."""

from __future__ import annotations

from app.usecases import dispatch, monitor
from models import JobState
from tests.unit.conftest import World


def _adopted_after_a_restart(world: World) -> str:
    """The submit landed on a process that was killed at once; reconcile's re-sent submit
    reaches the new process, which answers the token with the dead run. The job's id."""
    job_id = world.stuck_in_dispatching("adopted")
    job = world.job(job_id)
    server = world.server("net-a")
    world.admin("net-a").submit(world.rt.settings.job_root, job.submit_token)  # it landed
    server.restart()  # the process dies with the run; its record still reads RUNNING
    step = dispatch.dispatch(world.rt, job_id, "net-a", job.attempts)
    assert step.step.name == "DONE"
    assert world.job(job_id).state == JobState.RUNNING
    assert world.net("net-a").server_start_time == server.start_time  # no restart to see
    return job_id


def test_a_dead_run_adopted_by_a_re_sent_submit_is_lost_at_the_next_round(world):
    job_id = _adopted_after_a_restart(world)

    monitor.monitor_running_jobs(world.rt)

    job = world.job(job_id)
    assert job.state == JobState.QUEUED  # LOST_JOB_POLICY=requeue, not RUNNING for a day
    assert "began before this process" in (job.last_error or "")


def test_a_run_that_began_on_the_process_that_answers_is_watched_as_ever(world):
    job_id = world.enqueue("alive", net="net-a")
    world.run_pipeline(job_id)

    monitor.monitor_running_jobs(world.rt)

    assert world.job(job_id).state == JobState.RUNNING


def test_a_restart_seen_under_a_run_that_began_on_the_new_process_keeps_it(world, monkeypatch):
    # The start time stored is readiness's, of a process before the one the run lives on
    # (the submit's read failed across a restart): the run's own start says it lives here,
    # even when check_status's job table does not list it (as the real server, at times,
    # does not: tests/e2e/test_awaited_runs.py).
    job_id = world.enqueue("moved", net="net-a")
    world.run_pipeline(job_id)
    server = world.server("net-a")
    run = world.job(job_id).nvflare_job_id
    server.start_time += 200  # another process answers now ...
    server.started[run] = server.start_time + 1.0  # ... and the run began on it
    monkeypatch.setattr(type(world.admin("net-a")), "live_runs", lambda _self: frozenset())

    monitor.monitor_running_jobs(world.rt)

    assert world.job(job_id).state == JobState.RUNNING
    assert world.net("net-a").server_start_time == server.start_time


def test_a_status_unreadable_after_a_restart_is_asked_again_not_taken_for_lost(world, monkeypatch):
    # The run completed, then its server restarted; the first read of its status after the
    # restart fails (a blip): taken for lost, the job was requeued and its completed work run
    # again (the simulator's chaos seed 529). Asked again next round, it is COMPLETED.
    from app.errors import ServerUnavailable
    from tests.fakes import FakeAdmin

    job_id = world.enqueue("done-before-restart", net="net-a")
    world.run_pipeline(job_id)
    server = world.server("net-a")
    server.statuses[world.job(job_id).nvflare_job_id] = "FINISHED:COMPLETED"
    server.restart()
    real = FakeAdmin.job_status

    def blip(_admin: FakeAdmin, _run: str) -> None:
        raise ServerUnavailable("connection reset")

    monkeypatch.setattr(FakeAdmin, "job_status", blip)
    verdicts = monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING, verdicts
    monkeypatch.setattr(FakeAdmin, "job_status", real)

    monitor.monitor_running_jobs(world.rt)

    assert world.job(job_id).state == JobState.COMPLETED

"""A run killed with its server process reads RUNNING for ever in NVFLARE 2.9. When a
re-sent submit's token is answered, on the new process, with that dead run, the dispatcher
records the new process's start time, so no restart is ever seen: the run's own start time
(the job store's) is what says it ran on an earlier process. Found by the 10,000-seed sweep
(seeds 3894, 7305, 9969): the job read RUNNING until MAX_RUN_S, holding its server a day.
A run the answering process lists among its own lives on, whatever the two clocks say (a
server clock stepped back by NTP dates a live run before its process)."""

from __future__ import annotations

from app import names
from app.errors import ServerUnavailable, UnknownAdminError
from app.usecases import dispatch, monitor
from models import JobState
from tests.fakes import FakeAdmin
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
    # Lost to a restart: the server answers, so its dead run is settled by an abort now,
    # and the server it restarted on is kept for the next job.
    assert (names.SETTLE_STRAY_RUNS, {"net_name": "net-a"}) in world.outbox.sent
    assert world.driver("net-a").replicas == 1


def test_a_run_dated_before_its_process_is_watched_on_while_its_runs_cannot_be_listed(
    world, monkeypatch
):
    # Only the process's own job table tells a dead run from a live one that a server clock
    # stepped back dated before its process: the run is lost on that table's word alone.
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    server = world.server("net-a")
    server.started[world.job(job_id).nvflare_job_id] = server.start_time - 10.0

    def unreadable(_admin: FakeAdmin) -> frozenset[str]:
        raise UnknownAdminError("check_status: unreadable job table")

    monkeypatch.setattr(FakeAdmin, "live_runs", unreadable)
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "running"}
    assert world.job(job_id).state == JobState.RUNNING


def test_a_run_that_went_running_the_second_its_process_started_lives_on_it(world, monkeypatch):
    # Not before the process: so not lost, even though check_status does not list it.
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    server = world.server("net-a")
    server.started[world.job(job_id).nvflare_job_id] = server.start_time
    monkeypatch.setattr(FakeAdmin, "live_runs", lambda _admin: frozenset())
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "running"}
    assert world.job(job_id).state == JobState.RUNNING


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
    # The start time stored is kept, so that the next round sees the restart again.
    assert world.net("net-a").server_start_time == 1000.0
    monkeypatch.setattr(FakeAdmin, "job_status", real)

    monitor.monitor_running_jobs(world.rt)

    assert world.job(job_id).state == JobState.COMPLETED


def test_a_live_run_is_not_lost_because_its_server_clock_was_stepped_back(world):
    """app/usecases/README.md: a run is over only when its server, answering now, says so;
    the monitor's new rule (`_started_before`) takes a RUNNING run whose job-store start
    time is before the start time of the server process answering now as dead.

    Both times are the server's wall clock at two moments: `EngineInfo.start_time =
    time.time()` at process start and `datetime.now(UTC)` when the run went RUNNING. A
    server container that boots with its clock 90 s fast and is stepped back by NTP (chrony's
    makestep, ntpd's 128 ms step threshold) records its process start 90 s late; a run the
    first job starts on it within that margin reads as having begun before the process, and
    a healthy run, which the process itself lists among the runs it runs (`live_runs`), is
    declared lost: requeued, recorded as a stray and aborted, and run again."""
    server = world.server("net-a")
    server.start_time = 2090.0  # the process started at 2000 by a clock running 90 s fast
    job_id = world.enqueue("healthy", net="net-a")
    world.run_pipeline(job_id)
    run = world.job(job_id).nvflare_job_id
    server.started[run] = 2045.0  # went RUNNING 45 s after boot, the clock now corrected
    assert run in world.admin("net-a").live_runs()  # the server runs it, and says so

    monitor.monitor_running_jobs(world.rt)

    job = world.job(job_id)
    assert job.state == JobState.RUNNING, f"a healthy run declared lost: {job.last_error}"

"""Review of f31b5cd (an abort answered "before running it" is no proof the run is over).

nvflare 2.9's abort of a SUBMITTED or DISPATCHED job marks it FINISHED:ABORTED at once; the
job runner, if it was deploying or starting the run, then sets DISPATCHED/RUNNING over the
mark (job_runner.py, run loop). The change holds the run as a stray only when the abort's
own answer says "before running it". But the mark itself reads FINISHED:ABORTED, and every
path that learns of the abort some other way -- its reply lost after the server acted
(ServerUnavailable -> NOTHING_TO_ABORT, then a status read that succeeds), or a retried
abort that finds the mark (ALREADY_FINISHED) -- takes that mark for proof the run is over
and frees the net while the runner may still start the run: a second live run on the
server. The tests marked DEFECT failed on f31b5cd and pass since the mark itself is read
(FINISHED:ABORTED with no start time: `RunStatus.unstarted`, held like the answer); the
ones marked HOLDS pin behaviour that withstood the review."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.usecases import abort, dispatch, intake, monitor, services
from models import JobState, ReasonCode, StrayRun
from tests.unit.abort_replies import (
    held_for_one_window,
    reply_lost_after_the_server_acted,
    reply_unclassified_after_the_server_acted,
)

WINDOW = timedelta(seconds=abort.RUN_START_WINDOW_S)


def _strays(world) -> list[StrayRun]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def _dispatched(world, status: str = "DISPATCHED") -> str:
    """A job the dispatcher ran on net-a whose nvflare run the job runner is still starting."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = status
    return job_id


def _moved_on_with_a_stray(world, job_id) -> None:
    """The job moved on (flip-api ended it) while its run stayed: a stray known by id and
    token, recorded with no window (as dispatch's "submit landed after the job moved on")."""
    world.add_stray(job_id, "net-a", "nv-1", token=world.job(job_id).submit_token)
    with world.rt.sessions.begin() as session:
        services.finish_job(
            session,
            job_id,
            JobState.FAILED,
            "moved on",
            world.clock(),
            code=ReasonCode.REPORTED_ERROR,
        )


def _runner_overwrites_the_mark(world) -> None:
    """nvflare 2.9's job runner is done starting the run: RUNNING over FINISHED:ABORTED."""
    assert world.server("net-a").statuses["nv-1"] == "FINISHED:ABORTED"
    world.server("net-a").statuses["nv-1"] = "RUNNING"


def _net_takes_no_new_job(world) -> None:
    other = world.enqueue("next", net="net-a")
    assert dispatch.assign_jobs(world.rt) == [], "net-a took a job beside a run it may start"
    assert world.job(other).state == JobState.QUEUED


# --- DEFECT: a before-start abort learnt of other than by its own answer -------------------


def test_defect_abort_reply_lost_after_a_before_start_mark_frees_the_net(world):
    """abort_on_server: the abort marks the DISPATCHED run, its reply is lost; the status
    read that follows finds FINISHED:ABORTED (the mark) and settles the job with no stray,
    no window: the net takes the next job while the runner starts the aborted one."""
    job_id = _dispatched(world)
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    reply_lost_after_the_server_acted(world)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_defect_abort_retried_after_an_unclassified_reply_finds_the_mark_finished(world):
    """abort_on_server: the first abort marks the DISPATCHED run but its reply is an error
    (the job stays ABORTING, retried by the reconciler); the retry's status read finds
    FINISHED:ABORTED, ALREADY_FINISHED, and `_settle_finished` ends the job with no stray."""
    job_id = _dispatched(world)
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    reply_unclassified_after_the_server_acted(world)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTING
    world.clock.advance(5)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_defect_stray_settle_with_a_lost_reply_takes_the_mark_for_the_end(world):
    """settle_stray_runs: a stray recorded without a window (dispatch's "submit landed after
    the job moved on", which counts on the settle's abort answering before-start) is
    aborted while the runner starts it; the reply is lost, the status read finds the mark,
    and the stray is forgotten in the same round."""
    job_id = _dispatched(world, "SUBMITTED")
    _moved_on_with_a_stray(world, job_id)
    reply_lost_after_the_server_acted(world)
    abort.settle_stray_runs(world.rt, "net-a")  # on f31b5cd: 0 left, the stray forgotten
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_defect_overrun_abort_with_a_lost_reply_on_an_always_on_net(always_on):
    """monitor._stop_overrun on an always-on net (nothing takes it down): a run the job
    runner is only now starting (it stayed SUBMITTED until its sites came) is aborted as
    overrun; the reply is lost, the status read finds the mark: confirmed, no stray."""
    world = always_on
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "DISPATCHED"
    world.clock.advance(world.rt.settings.max_run_s + 1)
    reply_lost_after_the_server_acted(world)
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)] == "failed: overran"
    assert world.job(job_id).state == JobState.FAILED
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


# --- HOLDS: what withstood the review ------------------------------------------------------


def test_holds_before_start_stray_survives_an_unreachable_server_until_it_answers(world):
    """An abort answered before-start, then the server unreachable past the window: the
    stray is kept (nothing said the run is over), and settled once the server answers."""
    job_id = _dispatched(world)
    assert world.abort(job_id) == JobState.ABORTED
    world.server("net-a").up = False
    world.clock.advance(abort.RUN_START_WINDOW_S + 1)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    world.server("net-a").up = True
    assert abort.settle_stray_runs(world.rt, "net-a") == 0


def test_holds_token_only_stray_then_a_before_start_answer_keeps_the_window(world):
    """A stray known by its token only (a submit whose reply was lost) whose settle finds
    the run SUBMITTED: the abort answers before-start and the window holds the net."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    token = world.job(job_id).submit_token
    world.server("net-a").statuses["nv-1"] = "SUBMITTED"
    world.add_stray(job_id, "net-a", None, token=token)
    held_for_one_window(world)


def test_holds_overrun_abort_answered_before_start_on_an_always_on_net(always_on):
    """monitor._stop_overrun whose abort is answered before-start: the run is kept as a
    stray with the window, and the always-on net takes no job beside it."""
    world = always_on
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "DISPATCHED"
    world.clock.advance(world.rt.settings.max_run_s + 1)
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)] == "failed: overran"
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_holds_moved_on_stray_whose_settle_is_answered_before_start(world):
    """dispatch's "submit landed after the job moved on" stray (no window of its own): the
    settle's abort is answered before-start, which sets the window in the same round."""
    job_id = _dispatched(world, "SUBMITTED")
    _moved_on_with_a_stray(world, job_id)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_defect_monitor_reads_the_mark_of_an_unconfirmed_abort_as_the_end(world):
    """The abort marks the DISPATCHED run but its reply is an error (the job stays
    ABORTING); the monitor, which watches ABORTING jobs (every QUEUED_POLL_S while a queued
    job waits for the net), reads FINISHED:ABORTED and gives the abort's verdict: ABORTED,
    net free, no stray, while the job runner starts the run."""
    job_id = _dispatched(world)
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    reply_unclassified_after_the_server_acted(world)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTING
    world.enqueue("waiting", net="net-a")
    monitor.monitor_awaited_runs(world.rt)
    assert world.job(job_id).state == JobState.ABORTED  # the verdict f31b5cd gives
    _runner_overwrites_the_mark(world)
    assert dispatch.assign_jobs(world.rt) == [], "net-a took a job beside a run it may start"


def test_defect_sim_servers_profile_seed_222_finds_the_lost_reply_case():
    """The simulator reaches the settle_stray_runs case above on its own: profile
    "servers" (slow_start 0.3, lost_reply 0.1), seed 222. At t=103.2 s the settle's abort
    marks nv-net-a-3 while its job runner starts it, the reply is lost (NOTHING_TO_ABORT),
    job_status reads FINISHED:ABORTED, the stray is forgotten; at 105.5 s the next job is
    dispatched on net-a and at 108 s both runs are live. (The default sweep, profiles by
    seed, did not reach it in seeds 0-399; the servers profile alone, once in 800 seeds.)"""
    from tests.sim.profiles import PROFILES
    from tests.sim.seeds import run_seed

    servers = next(p for p in PROFILES if p.name == "servers")
    result = run_seed(222, servers)
    assert result.ok, result.summary()

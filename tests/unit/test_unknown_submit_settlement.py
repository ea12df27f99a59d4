"""abandon_dispatch: a DISPATCHING attempt whose submit outcome stayed unknown is settled by
its token before the job may run again: adopted if the server has the run, requeued if the
server says it has none, and otherwise its possible run is made harmless (the server taken
down, or, always-on, a stray run kept to abort)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.errors import ServerUnavailable
from app.usecases import dispatch, records, retries, unknown_submit
from app.usecases.dispatch import Step
from models import JobState, NetState, StrayRun
from tests.unit.scale_history import scale_decisions

REASON = "submit outcome unknown"


def _unknown_submit(world, net: str = "net-a"):
    """A job left DISPATCHING on `net`: its submit raised and no run is known."""
    job_id = world.enqueue("j", net=net)
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, net, 0)
    dispatch.check_ready(world.rt, job_id, net, 0)
    world.server(net).submit_error = ServerUnavailable("no reply")
    with pytest.raises(ServerUnavailable):
        dispatch.dispatch(world.rt, job_id, net, 0)
    world.server(net).submit_error = None
    assert world.job(job_id).state == JobState.DISPATCHING
    # No worker holds it any more: its lease (renewed right before the submit) has passed.
    world.clock.advance(retries.submit_try_s(world.rt.settings) + 1)
    return job_id


def _strays(world):
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def test_a_job_that_is_not_dispatching_is_left_alone(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    assert not unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    job = world.job(job_id)
    assert (job.state, job.attempts, job.nvflare_job_id) == (JobState.RUNNING, 0, "nv-1")
    assert _strays(world) == []


def test_an_assigned_job_is_left_alone(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    assert not unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    assert world.job(job_id).state == JobState.ASSIGNED
    assert _strays(world) == []


@pytest.mark.parametrize("server", ["answering", "silent"])
def test_a_submit_held_until_this_very_second_is_abandoned_only_after_it(world, server):
    """A worker holds the submit until its lease ends, that second included (as reconcile
    counts it): its job is neither requeued nor its token settled before."""
    job_id = _unknown_submit(world)
    with world.rt.sessions.begin() as session:  # a worker took the submit up again
        records.get_job(session, job_id).step_due_at = world.clock()
    world.server("net-a").up = server == "answering"
    assert not unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.DISPATCHING, 0)
    assert _strays(world) == []
    world.clock.advance(1)
    assert unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    assert world.job(job_id).state == JobState.QUEUED


def test_a_requeue_says_why(world):
    job_id = _unknown_submit(world)
    assert unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    job = world.job(job_id)
    assert (job.state, job.attempts, job.last_error) == (JobState.QUEUED, 1, REASON)


def test_an_adopted_run_records_the_server_start_time_for_restart_detection(world):
    job_id = _unknown_submit(world)
    with world.rt.sessions.begin() as session:  # readiness could not read it
        records.get_net(session, "net-a").server_start_time = None
    server = world.server("net-a")
    server.submitted[f"{job_id}-0"] = "nv-7"
    server.statuses["nv-7"] = "RUNNING"
    assert not unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    assert world.net("net-a").server_start_time == server.start_time


def test_a_server_that_says_there_is_no_run_keeps_running_even_if_its_start_time_fails(world):
    job_id = _unknown_submit(world)

    def start_time_lost() -> None:
        raise ServerUnavailable("reply lost")

    world.server("net-a").on_start_time = start_time_lost
    assert unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    assert world.job(job_id).state == JobState.QUEUED
    assert world.driver("net-a").replicas == 1  # the token was settled: nothing to take down


def test_a_job_that_moved_on_while_the_server_was_asked_is_not_requeued(world):
    job_id = _unknown_submit(world)
    admin = world.admin("net-a")
    real_find_run = admin.find_run

    def aborted_meanwhile(token: str) -> str | None:
        with world.rt.sessions.begin() as session:
            records.abort_job(session, job_id, "flip-api: stop", world.clock())
        return real_find_run(token)

    admin.find_run = aborted_meanwhile  # type: ignore[method-assign]
    assert not unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.ABORTING, 0)


def test_a_silent_always_on_server_keeps_the_possible_run_as_a_stray_run(world):
    job_id = _unknown_submit(world, net="fixed")
    world.server("fixed").up = False
    assert unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    job = world.job(job_id)
    assert (job.state, job.last_error) == (JobState.QUEUED, REASON)
    [stray] = _strays(world)
    assert (stray.net_name, stray.job_id, stray.submit_token, stray.reason) == (
        "fixed",
        job_id,
        f"{job_id}-0",
        REASON,
    )
    # An always-on server is never taken down: the stray run is aborted when it answers.
    assert world.net("fixed").state not in (NetState.STOPPING, NetState.STOPPED)
    assert world.driver("fixed").calls == []


def test_a_silent_scale_to_zero_server_is_taken_down_saying_for_which_job(world):
    job_id = _unknown_submit(world)
    world.server("net-a").up = False
    assert unknown_submit.abandon_dispatch(world.rt, job_id, REASON)
    job = world.job(job_id)
    assert (job.state, job.last_error) == (JobState.QUEUED, REASON)
    assert scale_decisions(world, "net-a")[-1] == (0, f"settling job {job_id}'s unknown submit")


def test_retries_exhausted_on_an_unknown_submit_never_start_a_second_run(world):
    # tests/sim/FINDINGS.md, hole 4: the submit landed, the reply was lost, the task ran out of
    # retries.
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
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
    assert not retries.requeue_after_transient(
        world.rt, job_id, "dispatch: retries exhausted", net_name="net-a", attempt=0
    )
    assert world.job(job_id).state == JobState.DISPATCHING  # the attempt is not abandoned
    server.on_submit = None
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.DONE  # adopts it
    assert world.job(job_id).nvflare_job_id == "nv-1"
    assert len(server.submitted) == 1


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

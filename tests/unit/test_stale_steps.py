"""A chain step, and the failure handler of a step whose retries ran out, acts only for the
attempt it was started for (the job, its net and its attempt: tests/sim/FINDINGS.md, hole 2):
a step whose job moved on meanwhile, to another attempt or past the step, skips and moves
nothing, and never submits the next attempt's run."""

from __future__ import annotations

from app.errors import AdminMisconfigured
from app.usecases import dispatch, reconciler, records, retries
from app.usecases.dispatch import Step
from models import JobState, NetState


def test_a_stale_chain_step_never_dispatches_the_next_attempt(world):
    # tests/sim/FINDINGS.md, hole 2: attempt 0's chain gives up; the job is claimed again
    # (attempt 1); attempt 0's dispatch step arrives late and must skip.
    job_id = world.enqueue("j", net="net-a", required_sites=["site-9"])
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    world.clock.advance(121)
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.GAVE_UP
    reconciler.reconcile(world.rt)  # net-a settles to STOPPED
    [again] = dispatch.claim_and_start(world.rt)
    assert again.attempt == 1
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    assert world.job(job_id).state == JobState.ASSIGNED
    assert world.server("net-a").submitted == {}


def test_a_stale_submit_never_goes_out_while_the_next_attempt_is_dispatching(world, monkeypatch):
    # tests/sim/FINDINGS.md, hole 2, later in the step: attempt 0's dispatch is copying its
    # bundle when the job moves on and is DISPATCHING again, on attempt 1 with its own token.
    # Attempt 0's submit must not go out (the same state is not the same attempt).
    job_id = world.enqueue("j", net="net-a")
    world.run_until_ready(job_id)
    real_prepare = dispatch.prepare

    def prepare_while_the_job_moves_on(*args, **kwargs):
        folder = real_prepare(*args, **kwargs)
        with world.rt.sessions.begin() as session:
            records.requeue_job(session, job_id, "moved on", world.clock())
        world.run_until_ready(job_id)
        with world.rt.sessions.begin() as session:
            records.get_job(session, job_id).start_dispatch(world.clock())
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


def test_a_late_readiness_check_never_flips_a_busy_net_back_to_ready(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    assert world.net("net-a").state == NetState.BUSY


# --- a failure handler moves only the attempt its step was started for -----------------------


def test_exhausted_retries_never_requeue_a_job_a_re_sent_submit_has_adopted(world):
    job_id = world.enqueue("j", net="net-a")
    net, attempt = world.run_until_ready(job_id)
    # The first task's submit landed but its reply was lost on its last retry; reconcile's
    # re-sent dispatch (same token) adopted the run.
    assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.DONE
    assert world.job(job_id).state == JobState.RUNNING
    assert not retries.requeue_after_transient(
        world.rt, job_id, "dispatch: retries exhausted", net_name=net, attempt=attempt
    )
    assert world.job(job_id).state == JobState.RUNNING
    assert world.net("net-a").state == NetState.BUSY


def test_exhausted_retries_leave_a_job_on_its_next_attempt_alone(world):
    job_id = world.enqueue("j", net="net-a")
    net, attempt = world.run_until_ready(job_id)
    with world.rt.sessions.begin() as session:
        records.requeue_job(session, job_id, "readiness gave up", world.clock())
    dispatch.claim_and_start(world.rt)  # attempt 1, ASSIGNED
    assert not retries.requeue_after_transient(
        world.rt, job_id, "scale_up: retries exhausted", net_name=net, attempt=attempt
    )
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.ASSIGNED, 1)


def test_a_failure_handler_without_a_step_binding_moves_nothing(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_until_ready(job_id)
    assert not retries.requeue_after_transient(world.rt, job_id, "abort_on_server: exhausted")
    assert world.job(job_id).state == JobState.ASSIGNED


def test_a_misconfigured_submit_never_requeues_a_job_a_re_sent_submit_has_adopted(always_on):
    """Always-on nets. A job's first submit is on the wire when reconcile's re-sent dispatch
    (same token) lands the run: job RUNNING. The first task's own submit then fails with a
    misconfiguration (its worker's fresh login is refused: an admin certificate that expired
    under it). `dispatch()` calls `net_misconfigured` with the job, unbound to its attempt,
    and `requeue_job` takes a RUNNING job: it goes back to the queue (attempt kept, no stray)
    while its run goes on on the always-on server, and is claimed onto the other net: two
    live runs of one job.

    Breaks: "At most one live run per job, whatever fails" and the commit's item 8 "a
    failure handler moves only the attempt its step was started for" (done for exhausted
    retries only, not for a handled misconfiguration)."""
    world = always_on
    job_id = world.enqueue("adopted", required_sites=["site-1"])
    net, attempt = world.run_until_ready(job_id)
    server = world.server(net)

    def re_sent_submit_lands_then_this_one_is_refused() -> None:
        server.on_submit = None
        assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.DONE
        raise AdminMisconfigured("admin login refused: certificate expired")

    server.on_submit = re_sent_submit_lands_then_this_one_is_refused
    # The step's job moved on: it ends quietly, leaving the net to the job's owner.
    assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.SKIPPED
    job = world.job(job_id)
    assert job.state == JobState.RUNNING, (job.state, job.last_error)

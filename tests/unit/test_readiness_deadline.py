"""Past a net's readiness deadline the job goes back to the queue with the reason, and a net
whose server never answered is marked: a scale-to-zero net UNHEALTHY and scaled down, an
always-on net OUTAGE and never scaled. A chain whose job moved on meanwhile touches neither.
(A server that answers but lacks the job's sites is the job's problem: test_declared_sites.py.)"""

from __future__ import annotations

from app.adapters.drivers.base import Observation
from app.usecases import dispatch, records, retries
from app.usecases.dispatch import Step
from models import JobState, NetState
from tests.unit.scale_history import scale_decisions


def _claimed(world, net: str):
    job_id = world.enqueue("j", net=net)
    world.server(net).up = False  # its server process never comes to answer
    [assignment] = dispatch.claim_and_start(world.rt)
    assert dispatch.scale_up(world.rt, job_id, net, assignment.attempt).step == Step.DONE
    return job_id


def test_a_scale_to_zero_net_past_its_deadline_is_unhealthy_and_scaled_down(world):
    job_id = _claimed(world, "net-a")
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.NOT_READY
    world.clock.advance(world.rt.settings.net("net-a").ready_timeout_s + 1)
    result = dispatch.check_ready(world.rt, job_id, "net-a", 0)
    assert result.step == Step.GAVE_UP
    job, net = world.job(job_id), world.net("net-a")
    assert result.detail == job.last_error
    assert (job.state, job.attempts) == (JobState.QUEUED, 1)
    assert job.last_error is not None and job.last_error.startswith("not ready after 120s")
    assert (net.state, net.last_error) == (NetState.UNHEALTHY, job.last_error)
    assert world.driver("net-a").replicas == 0
    assert scale_decisions(world, "net-a")[-1] == (0, "readiness deadline passed")


def test_an_always_on_net_past_its_deadline_is_an_outage_and_never_scaled(world):
    job_id = _claimed(world, "fixed")
    world.clock.advance(world.rt.settings.net("fixed").ready_timeout_s + 1)
    assert dispatch.check_ready(world.rt, job_id, "fixed", 0).step == Step.GAVE_UP
    job, net = world.job(job_id), world.net("fixed")
    assert job.state == JobState.QUEUED
    assert (net.state, net.last_error) == (NetState.OUTAGE, job.last_error)
    assert world.drivers.get("fixed") is None or world.drivers["fixed"].calls == []


def test_a_driver_failure_gives_up_at_once_unless_the_job_moved_on(world):
    job_id = _claimed(world, "net-a")

    def failed_and_aborted_meanwhile() -> Observation:
        with world.rt.sessions.begin() as session:
            records.abort_job(session, job_id, "flip-api: stop", world.clock())
        return Observation(0, 0, 0, failure="circuit breaker")

    world.driver("net-a").observe = failed_and_aborted_meanwhile  # type: ignore[method-assign]
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    assert world.job(job_id).state == JobState.ABORTED
    net = world.net("net-a")
    assert net.state != NetState.UNHEALTHY and net.last_error is None


def test_a_driver_failure_gives_up_at_once(world):
    job_id = _claimed(world, "net-a")
    world.driver("net-a").failure = "circuit breaker"
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.GAVE_UP
    assert world.job(job_id).last_error == "driver: circuit breaker"
    assert world.net("net-a").state == NetState.UNHEALTHY


def test_a_requeue_after_exhausted_retries_says_why(world):
    job_id = _claimed(world, "net-a")
    assert retries.requeue_after_transient(
        world.rt, job_id, "scale_up: retries exhausted", net_name="net-a", attempt=0
    )
    job = world.job(job_id)
    assert (job.state, job.last_error) == (JobState.QUEUED, "scale_up: retries exhausted")

"""What the chain's first two steps report and decide: scale_up says what it did with the
net (never scaled, found up, or asked for a replica, for which job), scales a READY net
whose server died unnoticed, and a bundle that cannot be fetched fails the job saying why;
a driver that turns out misconfigured says why on the net; readiness gives up strictly past
the deadline, saying what it last saw (the driver's counts, or the transient error)."""

from __future__ import annotations

import pytest

from app.errors import BundleUnavailable, DriverMisconfigured, DriverTransientError
from app.usecases import dispatch, records
from app.usecases.dispatch import Step, StepResult
from models import JobState, NetState, ReasonCode
from tests.unit.scale_history import scale_decisions


def _claim(world, net: str, key: str = "j"):
    job_id = world.enqueue(key, net=net)
    dispatch.claim_and_start(world.rt)
    return job_id


def test_scale_up_says_what_it_did_with_the_net(world):
    fixed = _claim(world, "fixed", "on-fixed")
    assert dispatch.scale_up(world.rt, fixed, "fixed", 0) == StepResult(
        Step.DONE, "always-on net: never scaled", warm=True
    )
    cold = _claim(world, "net-a", "cold")
    assert dispatch.scale_up(world.rt, cold, "net-a", 0) == StepResult(
        Step.DONE, "driver asked for 1 replica", warm=False
    )
    assert scale_decisions(world, "net-a") == [(1, f"job {cold} assigned")]
    assert dispatch.check_ready(world.rt, cold, "net-a", 0) == StepResult(Step.DONE, "ready")
    assert dispatch.dispatch(world.rt, cold, "net-a", 0).step == Step.DONE
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session, cold, JobState.COMPLETED, "done", world.clock(), code=ReasonCode.RUN_COMPLETED
        )
    warm = _claim(world, "net-a", "warm")
    assert dispatch.scale_up(world.rt, warm, "net-a", 0) == StepResult(
        Step.DONE, "server already up", warm=True
    )
    assert len(scale_decisions(world, "net-a")) == 1


def test_a_ready_net_whose_server_died_unnoticed_is_scaled_again(world):
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").state = NetState.READY  # the driver shows none
    job_id = _claim(world, "net-a")
    assert dispatch.scale_up(world.rt, job_id, "net-a", 0).warm is False
    assert world.driver("net-a").calls == [1]


def test_a_bundle_that_cannot_be_fetched_fails_the_job_saying_why(world, monkeypatch):
    job_id = _claim(world, "net-a")

    def gone(*_args):
        raise BundleUnavailable("s3://bucket/j.zip is gone")

    monkeypatch.setattr(dispatch, "materialize", gone)
    result = dispatch.scale_up(world.rt, job_id, "net-a", 0)
    assert result == StepResult(Step.GAVE_UP, "s3://bucket/j.zip is gone")
    job = world.job(job_id)
    # Worded by its code, never "rejected" (that is a refused enqueue, which has no job).
    assert (job.state, job.reason_code, job.last_error) == (
        JobState.FAILED,
        "bundle_unavailable",
        "bundle_unavailable: s3://bucket/j.zip is gone",
    )


def test_a_driver_found_misconfigured_by_scale_up_says_why_on_the_net(world):
    job_id = _claim(world, "net-a")
    world.driver("net-a").fail_with = DriverMisconfigured("service fl-server-net-a missing")
    with pytest.raises(DriverMisconfigured):
        dispatch.scale_up(world.rt, job_id, "net-a", 0)
    net = world.net("net-a")
    assert (net.state, net.last_error) == (
        NetState.MISCONFIGURED,
        "service fl-server-net-a missing",
    )


def test_readiness_gives_up_strictly_past_the_deadline_with_the_drivers_counts(world):
    job_id = _claim(world, "net-a")
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    world.driver("net-a").replicas = 0  # asked for, never started
    deadline = world.rt.settings.net("net-a").ready_timeout_s
    world.clock.advance(deadline)
    seen = "driver: desired=0 running=0 pending=0"
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0) == StepResult(Step.NOT_READY, seen)
    world.clock.advance(1)
    given_up = dispatch.check_ready(world.rt, job_id, "net-a", 0)
    assert given_up == StepResult(Step.GAVE_UP, f"not ready after {deadline:.0f}s: {seen}")


def test_readiness_that_could_not_be_checked_says_why_when_it_gives_up(world):
    job_id = _claim(world, "net-a")
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    world.driver("net-a").fail_with = DriverTransientError("throttled")
    world.clock.advance(world.rt.settings.net("net-a").ready_timeout_s + 1)
    result = dispatch.check_ready(world.rt, job_id, "net-a", 0)
    assert result.step == Step.GAVE_UP
    assert world.job(job_id).last_error == "not ready after 120s: transient: throttled"

"""What dispatch's start step spares a warm net: no second look at the driver, no extra
read of the job, and that an aborted submit is the only one that stops its run."""

from __future__ import annotations

from app.usecases import dispatch
from app.usecases.dispatch import Step
from models import JobState
from tests.unit.test_warm_dispatch import warm_net


def _claimed(world, key: str):
    job_id = world.enqueue(key, net="net-a")
    (assignment,) = dispatch.claim_and_start(world.rt)
    return job_id, assignment.attempt


def test_a_warm_start_looks_at_the_driver_once(world, monkeypatch):
    """The start step's readiness check trusts scale_up's look at the driver."""
    warm_net(world)
    job_id, attempt = _claimed(world, "warm")
    driver = world.driver("net-a")
    looks = []
    real = driver.observe
    monkeypatch.setattr(driver, "observe", lambda: looks.append(1) or real())

    assert dispatch.start(world.rt, job_id, "net-a", attempt).step == Step.DISPATCHED
    assert len(looks) == 1


def test_a_warm_start_does_not_ask_whether_the_job_is_resuming(world, monkeypatch):
    """Only a skipped scale_up pays the read that looks for a submit to resume."""
    warm_net(world)
    job_id, attempt = _claimed(world, "warm")
    asked = []
    monkeypatch.setattr(dispatch, "_resuming", lambda *a: asked.append(a) or False)

    assert dispatch.start(world.rt, job_id, "net-a", attempt).step == Step.DISPATCHED
    assert asked == []


def test_a_normal_submit_stops_no_run(world):
    """A submit that lands for its DISPATCHING job sends no abort and no stray settlement."""
    job_id = world.enqueue("plain", net="net-a")
    world.run_pipeline(job_id)
    assert world.job(job_id).state == JobState.RUNNING
    assert [task for task, _ in world.outbox.sent if task != "pipeline"] == []

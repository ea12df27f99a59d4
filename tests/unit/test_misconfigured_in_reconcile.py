"""A net found misconfigured takes its job back to the queue without costing an attempt,
wherever in the chain that is found; reconcile, which read the job earlier, leaves a job that
moved past ASSIGNED meanwhile (and its net) to whoever moved it, and says so."""

from __future__ import annotations

import pytest

from app.errors import AdminMisconfigured, DriverMisconfigured
from app.usecases import dispatch, reconciler, records
from app.usecases.dispatch import Step
from models import JobState, NetState


def test_a_submit_refused_as_misconfigured_takes_the_net_out_and_requeues_the_job(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    world.server("net-a").submit_error = AdminMisconfigured("admin not authorized")
    with pytest.raises(AdminMisconfigured):
        dispatch.dispatch(world.rt, job_id, "net-a", 0)
    assert world.net("net-a").state == NetState.MISCONFIGURED
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 0)


def _claimed_and_overdue(world):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)  # its chain is lost before scale_up
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    return job_id


def test_reconcile_marks_the_net_and_requeues_a_job_still_assigned(world):
    job_id = _claimed_and_overdue(world)
    world.driver("net-a").fail_with = DriverMisconfigured("service missing")
    repaired = reconciler.reconcile(world.rt).repaired
    assert "net-a: misconfigured: service missing" in repaired
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.job(job_id).state == JobState.QUEUED


def test_reconcile_leaves_a_job_that_moved_on_while_it_looked(world):
    job_id = _claimed_and_overdue(world)

    def aborted_meanwhile():
        with world.rt.sessions.begin() as session:
            records.abort_job(session, job_id, "flip-api: stop", world.clock())
        raise DriverMisconfigured("service missing")

    world.driver("net-a").observe = aborted_meanwhile  # type: ignore[method-assign]
    repaired = reconciler.reconcile(world.rt).repaired
    assert f"net-a: misconfigured: service missing (job {job_id} moved on: left to it)" in repaired
    assert world.net("net-a").state != NetState.MISCONFIGURED
    assert world.job(job_id).state == JobState.ABORTED


def test_reconcile_finding_a_starting_net_misconfigured_requeues_its_assigned_job(world):
    # simulator seed 548 (chaos): the chain's wait_ready message was lost, reconcile found the
    # net's service gone and marked it MISCONFIGURED with the job still ASSIGNED to it; a
    # worker restart then reset the net to STOPPED under the job.
    from app.errors import DriverMisconfigured

    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    assert dispatch.scale_up(world.rt, job_id, "net-a", 0).step == Step.DONE
    world.driver("net-a").fail_with = DriverMisconfigured("service not found")
    world.clock.advance(world.rt.settings.stuck_after_s + 1)  # its chain is long gone
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.MISCONFIGURED
    job = world.job(job_id)
    assert (job.state, job.net_name, job.attempts) == (JobState.QUEUED, None, 0)


def test_reconcile_leaves_a_net_a_job_was_claimed_onto_while_it_looked(world):
    # simulator seed 5597 (chaos): reconcile read net-b with no job, a worker claimed a job
    # onto it meanwhile, and reconcile's probe, answering "service not found" for a moment,
    # marked the net MISCONFIGURED under the ASSIGNED job; its chain later tried
    # MISCONFIGURED -> BUSY, failed, and the job sat DISPATCHING for good.
    job_id = world.enqueue("j", net="net-a")

    def claimed_meanwhile():
        dispatch.claim_and_start(world.rt)
        raise DriverMisconfigured("service not found")

    world.driver("net-a").observe = claimed_meanwhile  # type: ignore[method-assign]
    repaired = reconciler.reconcile(world.rt).repaired
    assert (
        "net-a: misconfigured: service not found (a job claimed the net meanwhile: left to its"
        " chain)" in repaired
    )
    assert world.net("net-a").state == NetState.STARTING
    job = world.job(job_id)
    assert (job.state, job.net_name) == (JobState.ASSIGNED, "net-a")


def test_monitor_leaves_a_net_a_job_was_claimed_onto_after_its_jobs_were_settled(world):
    # The same race on the monitor's path: the busy net's jobs were requeued, and a claim
    # took the net before it was marked; the new job's chain settles the net itself.
    from app.usecases import scaling

    first = world.enqueue("j1", net="net-a")
    dispatch.claim_and_start(world.rt)
    with world.rt.sessions.begin() as session:
        records.requeue_job(session, first, "lost", world.clock(), count_attempt=False)
    dispatch.claim_and_start(world.rt)  # the same job, claimed again
    assert not scaling.net_misconfigured(world.rt, "net-a", None, "admin access failed")
    assert world.net("net-a").state == NetState.STARTING
    assert world.job(first).state == JobState.ASSIGNED

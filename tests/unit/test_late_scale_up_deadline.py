"""A job's readiness deadline counts from the first ask for its replica when the chain's
scale_up ran late (its message waited out a broker outage past ready_timeout_s), as a
job-less start's does (`outages.start_age_s`): the sweep's late-start worlds (ops 455)
showed wait_ready giving the job up 0.4 s after the ask, the net UNHEALTHY and scaled down,
the job requeued on an attempt it never had a chance to use."""

from __future__ import annotations

from app.usecases import dispatch
from app.usecases.dispatch import Step
from models import JobState


def test_a_chain_whose_scale_up_ran_late_waits_its_deadline_from_the_ask(world):
    job_id = world.enqueue("late", net="net-a")  # net-a: ready_timeout_s 120
    claimed = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    net, attempt = claimed.net_name, claimed.attempt
    world.clock.advance(130)  # the scale_up message waited out a broker outage
    assert dispatch.scale_up(world.rt, job_id, net, attempt).step == Step.DONE
    world.server(net).up = False  # its server boots
    world.clock.advance(1)
    assert dispatch.check_ready(world.rt, job_id, net, attempt).step == Step.NOT_READY
    world.clock.advance(60)
    world.server(net).up = True  # up within ready_timeout_s of the ask
    assert dispatch.check_ready(world.rt, job_id, net, attempt).step == Step.DONE
    assert world.job(job_id).state == JobState.ASSIGNED


def test_a_late_ask_s_deadline_still_ends(world):
    """Bounded all the same: ready_timeout_s after the ask, the job is given up."""
    job_id = world.enqueue("late-never-up", net="net-a")
    claimed = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    net, attempt = claimed.net_name, claimed.attempt
    world.clock.advance(130)
    assert dispatch.scale_up(world.rt, job_id, net, attempt).step == Step.DONE
    world.server(net).up = False  # never comes up
    world.clock.advance(121)
    assert dispatch.check_ready(world.rt, job_id, net, attempt).step == Step.GAVE_UP


def test_reconcile_leaves_a_chain_waiting_on_a_late_ask_to_its_own_deadline(world):
    """Reconcile requeues an ASSIGNED job whose chain is gone past the readiness deadline
    plus STUCK_AFTER_S; with the chain's deadline counted from a late ask, it counts from
    there too, or it would requeue a job its chain is still rightly waiting for."""
    from app.usecases import reconciler

    job_id = world.enqueue("late-reconciled", net="net-a")
    claimed = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    net, attempt = claimed.net_name, claimed.attempt
    stuck_s = world.rt.settings.stuck_after_s
    world.clock.advance(120 + stuck_s - 5)  # the scale_up message waited out an outage
    assert dispatch.scale_up(world.rt, job_id, net, attempt).step == Step.DONE
    world.server(net).up = False  # its server boots
    world.clock.advance(30)  # past the claim's deadline + STUCK_AFTER_S, not the ask's
    reconciler.reconcile(world.rt)
    assert world.job(job_id).state == JobState.ASSIGNED
    assert dispatch.check_ready(world.rt, job_id, net, attempt).step == Step.NOT_READY

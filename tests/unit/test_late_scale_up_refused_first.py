"""A job's readiness deadline counts from the first ask the driver TOOK since its claim
(round 16's break-it on 1967120): a first try refused, then a retry held past the deadline
by a broker outage, gave the job up at the ask that worked."""

from __future__ import annotations

import pytest

from app.errors import DriverTransientError
from app.usecases import dispatch
from app.usecases.dispatch import Step
from models import JobState


def test_a_scale_up_refused_once_then_held_by_an_outage_waits_from_the_ask_that_took(world):
    """The chain's scale_up tried at once, the platform refused it (a throttle: recorded as
    an ask, outcome error), and its retry waited out a broker outage past ready_timeout_s:
    the replica was asked for only then, yet the job is given up at that ask."""
    job_id = world.enqueue("refused-then-late", net="net-a")  # ready_timeout_s 120
    claimed = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    net, attempt = claimed.net_name, claimed.attempt
    world.driver(net).fail_with = DriverTransientError("throttled")
    world.clock.advance(1)
    with pytest.raises(DriverTransientError):
        dispatch.scale_up(world.rt, job_id, net, attempt)  # the task retries
    world.driver(net).fail_with = None
    world.clock.advance(130)  # the retry's message waited out a broker outage
    assert dispatch.scale_up(world.rt, job_id, net, attempt).step == Step.DONE
    world.server(net).up = False  # its server boots
    world.clock.advance(1)
    assert dispatch.check_ready(world.rt, job_id, net, attempt).step == Step.NOT_READY
    assert world.job(job_id).state == JobState.ASSIGNED


def test_reconcile_leaves_a_chain_whose_first_try_was_refused_to_its_deadline(world):
    """As above, reconcile's stuck-ASSIGNED requeue: the chain still waits rightly for a
    server asked for late, yet a refused first try makes it requeue the job."""
    from app.usecases import reconciler

    job_id = world.enqueue("refused-then-late-reconciled", net="net-a")
    claimed = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    net, attempt = claimed.net_name, claimed.attempt
    stuck_s = world.rt.settings.stuck_after_s
    world.driver(net).fail_with = DriverTransientError("throttled")
    with pytest.raises(DriverTransientError):
        dispatch.scale_up(world.rt, job_id, net, attempt)
    world.driver(net).fail_with = None
    world.clock.advance(120 + stuck_s - 5)  # the retry's message waited out an outage
    assert dispatch.scale_up(world.rt, job_id, net, attempt).step == Step.DONE
    world.server(net).up = False  # its server boots
    world.clock.advance(30)  # past the claim's deadline + STUCK_AFTER_S, not the ask's
    reconciler.reconcile(world.rt)
    assert world.job(job_id).state == JobState.ASSIGNED

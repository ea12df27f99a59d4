"""Round 15's second break-it pass (against 6483ba4): an always-on OUTAGE now has its driver
read each round (`watch_always_on`: its replica asked for again if gone); each test failed
on that commit."""

from __future__ import annotations

from app.errors import DriverTransientError
from app.usecases import reconciler
from models import NetState


def test_an_outage_whose_server_answers_again_is_ready_while_its_platform_api_refuses(always_on):
    """README, FlDispatcherNetOutage: "Once the server answers, the net is READY again."
    net-a (always-on ECS, its replica running) loses its server, an OUTAGE; the server
    answers again while the platform's API refuses every call (throttled, its endpoint
    unreachable: the replica itself is fine). Before 6483ba4 an OUTAGE's driver was never
    read and the server's answer ended it; since, the refused read ends the net's round
    before the server is asked, so the page keeps firing on a net that works for as long
    as the platform's API is out."""
    world = always_on
    world.driver("net-a").replicas = 1
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.READY
    world.server("net-a").up = False
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.OUTAGE
    world.server("net-a").up = True  # the server is back ...
    world.driver("net-a").fail_with = DriverTransientError("ThrottlingException")  # ... the API not
    for _ in range(3):
        world.clock.advance(30)
        reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.READY, "an OUTAGE whose server answers"

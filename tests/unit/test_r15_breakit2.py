"""Round 15's second break-it pass (against 6483ba4): an always-on OUTAGE now has its driver
read each round (`watch_always_on`: its replica asked for again if gone); each test failed
on that commit."""

from __future__ import annotations

from app.errors import DriverTransientError
from app.usecases import reconciler, scaling
from models import NetState
from tests.unit.scale_history import scale_decisions
from tests.unit.test_r15_breakit import RUNNING, _a_container_that_crashed_long_ago
from tests.unit.test_revived_strays import _net_state, _stray_on, _world


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


def test_an_adopted_settling_start_whose_container_exits_is_failing_at_once(
    tmp_path, job_root, sqlite_factory, clock
):
    """app/deploy/CHANGELOG.md (b24e237): "A job-less start that settles stray runs (or a
    replica started by hand and adopted as one) whose driver reports a failure of this start
    with nothing running is UNHEALTHY at once". fl-a (Flower, its strays kept in the
    SuperLink's database) is STOPPED; an operator starts its docker container by hand (the
    stray alert's advice) and reconcile adopts it as a settling start; the container then
    exits on its own: UNHEALTHY at once, the exit its error. A docker container that exited
    reads as no replica desired, and since b24e237 such a failure of a settling start counts
    only after a scale-up the driver took since the start; an adopted start has none (it
    was waited out to ready_timeout_s, then abandoned, its error not the container's exit),
    so an adoption now has its own reason (`failed_starts.ADOPTED_START`)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    _stray_on(world, "fl-a")
    world.server("fl-a").up = False
    assert scaling.take_down(world.rt, "fl-a", "test")
    engine = _a_container_that_crashed_long_ago(world, "fl-a")
    engine["now"] = RUNNING  # `docker start` by hand
    reconciler.reconcile(world.rt)
    assert _net_state(world, "fl-a") == NetState.STARTING  # adopted to settle
    assert scale_decisions(world, "fl-a")[-1][0] == 0  # nothing asked since the take-down
    engine["now"] = {"Status": "exited", "ExitCode": 2, "FinishedAt": "2026-12-05T13:00:05Z"}
    clock.advance(30)
    reconciler.reconcile(world.rt)
    net = world.net("fl-a")
    assert net.state != NetState.STARTING, "an adopted start whose container exited waited out"
    assert net.last_error is not None and "exited on its own with code 2" in net.last_error

"""A settling start whose replica's tasks fail to start (the driver reports the failure, no
replica runs) is failing at once, as a job's or a prewarm's start is (dispatch._check_ready,
warm_up._poll), not waited out to ready_timeout_s: whether the dispatcher started it
(`_start_to_settle`) or reconcile adopted a replica an operator scaled up by hand."""

from __future__ import annotations

import logging

import pytest

from app.adapters.drivers.base import Observation
from app.usecases import reconciler, scaling
from models import NetState
from tests.unit.conftest import World
from tests.unit.test_revived_strays import _net_state, _stray_on, _strays, _world

FAILURE = "tasks failed to start (circuit breaker)"


def _tasks_fail(world: World, net: str) -> None:
    """The platform keeps the replica desired but never runs it: every task it starts stops
    with an error, which it reports as the service's failure."""
    driver = world.driver(net)

    def observe() -> Observation:
        return Observation(driver.replicas, 0, 0, failure=FAILURE if driver.replicas else None)

    driver.observe = observe  # type: ignore[method-assign]


@pytest.mark.parametrize("started", ["by-the-dispatcher", "by-hand"])
def test_a_settling_start_whose_tasks_fail_is_failing_at_once(
    tmp_path, job_root, sqlite_factory, clock, caplog, started
) -> None:
    """fl-a holds a stray its SuperLink's database keeps; it is taken down, then started to
    settle it: by reconcile (`_start_to_settle`), or by an operator scaling the service up
    by hand before reconcile's next round (adopted as a settling start). The platform's
    tasks fail to start. The next round gives the start up (UNHEALTHY, the failure as its
    error, logged, the replica taken back), as a job's start is given up, not after the
    net's ready_timeout_s (120 s); the stray is kept for the next settling start."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    _stray_on(world, "fl-a")
    world.server("fl-a").up = False
    assert scaling.take_down(world.rt, "fl-a", "test")
    _tasks_fail(world, "fl-a")
    if started == "by-hand":
        world.driver("fl-a").replicas = 1  # UpdateService desiredCount=1 by hand
    reconciler.reconcile(world.rt)
    assert _net_state(world, "fl-a") == NetState.STARTING  # started, or adopted, to settle
    assert world.driver("fl-a").replicas == 1
    clock.advance(30)  # the next round, far inside ready_timeout_s
    with caplog.at_level(logging.ERROR):
        reconciler.reconcile(world.rt)
    net = world.net("fl-a")
    assert net.state != NetState.STARTING, "a failing replica waited out as if booting"
    assert net.last_error == f"driver: {FAILURE}"
    assert world.driver("fl-a").replicas == 0
    assert any(r.levelname == "ERROR" and r.net == "fl-a" for r in caplog.records)
    assert len(_strays(world, "fl-a")) == 1


def test_a_settling_start_still_booting_is_left_to_boot(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """No failure reported: the replica is booting (desired, not running yet) and the start
    waits for it up to its readiness deadline, as before."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    _stray_on(world, "fl-a")
    world.server("fl-a").up = False
    assert scaling.take_down(world.rt, "fl-a", "test")
    driver = world.driver("fl-a")
    driver.observe = lambda: Observation(driver.replicas, 0, driver.replicas)  # type: ignore[method-assign]
    reconciler.reconcile(world.rt)
    clock.advance(30)
    reconciler.reconcile(world.rt)
    assert _net_state(world, "fl-a") == NetState.STARTING
    assert driver.replicas == 1

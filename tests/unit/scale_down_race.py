"""Staging a scale-down race in tests: a net idle past its grace, and work done by others
while its scale-to-0 call is on the wire."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from tests.unit.conftest import World

IDLE_S = 60  # the `world` fixture's idle_timeout_s for net-a


def idle_past_grace(world: World, idle_s: float = IDLE_S) -> uuid.UUID:
    """net-a ran a job that is over, and has been idle for `idle_s` (its whole grace by
    default). The job's id."""
    job_id = world.enqueue("done", net="net-a")
    world.run_to_completion(job_id)
    world.clock.advance(idle_s)
    return job_id


def on_first_scale_down(
    world: World, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], None]
) -> None:
    """`meanwhile` runs while net-a's first scale-to-0 call is on the wire, before it lands."""
    driver = world.driver("net-a")
    real = driver.scale
    fired: list[int] = []

    def scale(replicas: int) -> None:
        if replicas == 0 and not fired:
            fired.append(replicas)
            meanwhile()
        real(replicas)

    monkeypatch.setattr(driver, "scale", scale)

"""What the world's fakes (the platform and its admin clients, the bundles, the callback
receiver, the broker) call back on the simulation that owns them: its clock and random
streams, the fault profile in force, its hook points, the trace, what it records as found,
and the checks made at an adapter call. The engine's own parts and the harness read more of
it: `app.sim.view.SimView`."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Protocol

from app.sim.clock import SimClock
from app.sim.faults import FaultProfile
from app.sim.workload import JobSpec


class Outages(Protocol):
    """The simulated broker as a fake sees it: its outages, (from, until) in simulated time."""

    outages: list[tuple[float, float]]


class Host(Protocol):
    """The simulation as a fake of the world sees it."""

    clock: SimClock
    rng: random.Random  # the fault stream
    rng_msg: random.Random  # the message stream

    @property
    def broker(self) -> Outages:
        """The broker's outages: while one lasts no message is delivered."""
        ...

    @property
    def faults(self) -> FaultProfile: ...

    def trace(self, line: str) -> None: ...

    def hook(self, point: str, net: str | None) -> None: ...

    def reader(self) -> int | None:
        """The id of the message whose handler makes the call now (None: the harness)."""
        ...

    def report(self, invariant: str, subject: str, detail: str) -> None: ...

    def on_submit(self, net: str, token: str, folder: Path, *, repeat: bool = False) -> None: ...

    def on_scale(self, net: str, replicas: int) -> None: ...

    def job_spec(self, job_id: str) -> JobSpec | None: ...

    def scales_to_zero(self, net: str) -> bool: ...

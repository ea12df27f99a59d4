"""What the parts of a `Simulation` use of the whole: the state `Simulation.__init__` sets
up and the methods one part calls on another. Each part (app.sim.interleaving,
app.sim.delivery, app.sim.fast_forward, app.sim.adversary, app.sim.call_invariants)
subclasses `SimHost`; `Simulation` (app.sim.simulation) combines them."""

from __future__ import annotations

import random
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from app.runtime import Runtime
from app.settings import Settings
from app.sim.bundles import FakeS3, LocalBundle
from app.sim.calm import Calm
from app.sim.clock import ProcessClock, SimClock
from app.sim.cluster import Cluster
from app.sim.faults import FaultProfile
from app.sim.invariants import Checker
from app.sim.messages import Broker, Message
from app.sim.receiver import SimReceiver
from app.sim.redeploy import Declared
from app.sim.workload import JobSpec, Workload, WorldSpec


class SimHost(ABC):
    """A simulation as its parts see it: the state, declared, and the methods, abstract here."""

    world: WorldSpec
    workload: Workload
    profile: FaultProfile
    faults: FaultProfile  # the profile, or its quiet copy once the workload has ended
    seed: int
    tracing: bool
    fail_fast: bool
    fast_forward: bool
    claim_prewarms: bool  # the sweep's worlds: hints at a claim's instant too
    rng: random.Random  # the fault stream
    rng_msg: random.Random  # the message stream
    clock: SimClock
    process_clocks: list[ProcessClock]  # each worker slot's own reading
    conn: sqlite3.Connection
    cluster: Cluster
    broker: Broker
    per_job_fl_server: bool
    declared: Declared
    local_bundle: LocalBundle
    s3: FakeS3
    settings: Settings
    receiver: SimReceiver
    workers: list[Runtime]
    checker: Checker
    ready_seen: dict[tuple[str, str], str]
    stats: dict[str, int | float]
    _bundle_adversary: random.Random | None
    _scales: dict[str, bool]
    _declared: dict[str | None, bool]
    _events: list[tuple[float, int, str, Callable[[], None]]]
    _stack: list[int]
    _dead: set[int]
    _rng_stall: random.Random
    _rng_last_try: random.Random
    _rng_slow_scale: random.Random
    _last_try_seen: set[int]
    _net_events_at_start: dict[int, int]
    _stalled: int | None
    _resumed: tuple[str, float] | None
    _late_stops: dict[int, list[tuple[str, int]]]
    _flip_window: tuple[float, float] | None
    _triggers: list[tuple[str, str, str, Callable[[], None]]]
    _current: list[Message]
    _draining: bool

    # Simulation's own
    @abstractmethod
    def trace(self, line: str) -> None: ...

    @abstractmethod
    def at(self, t: float, label: str, action: Callable[[], None]) -> None: ...

    @abstractmethod
    def scales_to_zero(self, net: str) -> bool: ...

    @abstractmethod
    def job_spec(self, job_id: str) -> JobSpec | None: ...

    @abstractmethod
    def _settings(self) -> Settings: ...

    @abstractmethod
    def _restart_worker(self, slot: int, why: str) -> None: ...

    @abstractmethod
    def _step(self, slot: int) -> bool: ...

    @abstractmethod
    def _next_change(self) -> float: ...

    @abstractmethod
    def _advance(self) -> bool: ...

    # one part's, called by another
    @abstractmethod
    def hook(self, point: str, net: str | None) -> None: ...

    @abstractmethod
    def _deliver(self, message: Message, slot: int) -> None: ...

    @abstractmethod
    def _check_late_stops(self, message: Message) -> None: ...

    @abstractmethod
    def _fire_triggers(self) -> bool: ...

    @abstractmethod
    def _calm(self) -> Calm: ...

    @abstractmethod
    def _poll_delay(self, kwargs: dict[str, Any]) -> float: ...

"""The simulation as its engine's parts see it (app.sim.delivery, app.sim.interleaving,
app.sim.fast_forward, app.sim.caller, app.sim.state): the world it holds, the workers and
what they run now, and the calls one part makes on another through the `Simulation` that
owns them all. The world's fakes see less of it (`app.sim.host.Host`); the harness under
tests/sim, which the engine never imports, reads the `Simulation` itself."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from app.handlers import Kind
from app.runtime import Runtime
from app.settings import Settings
from app.sim.bundles import FakeS3, LocalBundle
from app.sim.calm import Calm
from app.sim.clock import ProcessClock
from app.sim.cluster import Cluster
from app.sim.deployment import Declared
from app.sim.faults import FaultProfile
from app.sim.host import Host
from app.sim.messages import Broker, Message
from app.sim.receiver import SimReceiver
from app.sim.report import Violation
from app.sim.workload import Workload, WorldSpec

# The simulation a checker or an adversary is given (the harness reads all of it).
S_contra = TypeVar("S_contra", contravariant=True)


class SimView(Host, Protocol):
    """What the engine's parts read and call of the simulation."""

    world: WorldSpec
    workload: Workload
    profile: FaultProfile
    seed: int
    tracing: bool
    fail_fast: bool
    fast_forward: bool
    conn: sqlite3.Connection
    sessions: sessionmaker[Session]  # the plain sessions (no hook point), as the harness uses
    cluster: Cluster
    broker: Broker
    receiver: SimReceiver
    s3: FakeS3
    local_bundle: LocalBundle
    settings: Settings
    declared: Declared
    workers: list[Runtime]
    process_clocks: list[ProcessClock]  # each worker slot's own clock (a step moves one)
    stats: dict[str, int | float]
    violations: list[Violation]
    ready_seen: dict[tuple[str, str], str]  # (job, net) -> the assignment seen ready
    running: list[int]  # the worker slots of the messages being processed, outermost first
    current: list[Message]  # those messages
    dead: set[int]  # slots whose current message was killed
    stalled: int | None  # the slot of a stalled worker
    # Where the running worker last resumed from a stall, and after how long; cleared at its
    # next hook point (so an adapter call can tell it was paused right before it).
    resumed: tuple[str, float] | None
    draining: bool  # the workload's horizon has passed: faults have stopped
    starting_worker: bool  # a worker process is starting (its own work is never failed)

    # --- the run loop ----------------------------------------------------------------------

    def step(self, slot: int) -> bool: ...

    def advance(self) -> bool: ...

    def next_change(self) -> float: ...

    def next_event_time(self) -> float | None: ...

    def deliver(self, message: Message, slot: int) -> None: ...

    def pause(
        self, slot: int, point: str, length_s: float, done: Callable[[], bool] | None = None
    ) -> None: ...

    def restart_worker(self, slot: int, why: str) -> None: ...

    def reconfigure(self) -> None: ...

    # --- the deployment and the caller -----------------------------------------------------

    def at(self, t: float, label: str, action: Callable[[], None]) -> None: ...

    def declared_net(self, net: str | None) -> bool: ...

    def armed(self) -> bool: ...

    def fire_triggers(self) -> bool: ...

    # --- the fast clock -----------------------------------------------------------------------

    def calm(self) -> Calm: ...

    def poll_delay(self, kwargs: dict[str, Any]) -> float: ...

    # --- the checker and the adversary, if the simulation has them --------------------------

    def after_message(self, message: Message, finished: bool) -> None: ...

    def at_hook(self, point: str, net: str | None, fired: bool) -> None: ...

    def excuse(self, kind: Kind, exc: BaseException) -> str | None: ...

    def refused(self, kind: Kind, exc: BaseException) -> bool: ...


class Checks(Protocol[S_contra]):
    """A checker: what a simulation calls on the one it is given."""

    def start(self, sim: S_contra) -> None:
        """Watch `sim` from now on (its first worker has started)."""

    def after_step(self) -> None:
        """A message was delivered, or the clock moved on."""

    def on_submit(self, net: str, token: str, folder: Path, *, repeat: bool = False) -> None:
        """A submit reaches a server (before it acts)."""

    def on_scale(self, net: str, replicas: int) -> None:
        """A scale call reaches the platform (before it acts)."""

    def after_message(self, message: Message, finished: bool) -> None:
        """A delivery ended (`finished`: the task returned or raised; else its worker died)."""

    def quiescence(self, reasons: list[str]) -> None:
        """The world did not come to rest by the liveness bound: why not."""

    def at_end(self) -> None:
        """The run is over (its database still open)."""


class Moves(Protocol[S_contra]):
    """An adversary: what a simulation calls on the one it is given."""

    def start(self, sim: S_contra) -> None:
        """Act on `sim` from now on (before its first worker starts)."""

    def moments(self) -> None:
        """Schedule its moments (after the caller's hints, before its enqueues)."""

    def at_hook(self, point: str, net: str | None, fired: bool) -> None:
        """A hook point inside a worker, after the simulation's own physics there."""

    def after_step(self) -> None:
        """A message was delivered, or the clock moved on (before the checker looks)."""

    def at_drain(self) -> None:
        """The workload's horizon: faults stop."""

    def excuse(self, kind: Kind, exc: BaseException) -> str | None:
        """Why an error it injected out of a handler of `kind` is no finding (None: it is)."""

    def refused(self, kind: Kind, exc: BaseException) -> bool:
        """`exc` is its refusal of a row: a caller's request failed by it is not lost."""

    def stop(self) -> None:
        """The run is over: take back what it installed."""

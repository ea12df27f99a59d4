"""The scale-driver interface: how a net's fl-server gets 0 or 1 replicas, and the
observation pass that lets a driver read many nets in one platform call."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

# How old an observation read for a neighbour may be when its own net asks for it.
PASS_MAX_AGE_S = 5.0


@dataclass(frozen=True)
class Observation:
    """What the platform says about a net's server right now."""

    desired: int
    running: int
    pending: int
    failure: str | None = None  # e.g. ECS circuit breaker FAILED, service INACTIVE

    @property
    def is_up(self) -> bool:
        """At least one replica is running."""
        return self.running >= 1


class ScaleDriver(Protocol):
    """One net's scaler. Errors: DriverTransientError or DriverMisconfigured (app.errors)."""

    kind: str

    def scale(self, replicas: int) -> None:
        """Ask for `replicas` (0 or 1); idempotent."""
        ...

    def observe(self) -> Observation:
        """Desired, running and pending replicas, and the platform's failure reason if any."""
        ...


class ObservationPass:
    """One pass over many nets (a reconcile round, a status view). A driver that can read
    several nets in one platform call (ECS DescribeServices: 10 services) leaves what it
    read for the other nets here; each such observation is served once, to its own net, and
    only while younger than `max_age_s`. Anything else, or a second look at the same net,
    is read afresh, and a scale call forgets what the pass held for its net. Outside a pass
    every observation is read afresh.

    `order`, when given, names the nets the pass will observe, in order: a batch is then
    made of those nets only."""

    def __init__(self, order: Sequence[str] = (), max_age_s: float = PASS_MAX_AGE_S) -> None:
        self.order = tuple(order)
        self.max_age_s = max_age_s
        self._held: dict[Hashable, tuple[float, object]] = {}
        self._read: set[Hashable] = set()
        self._lock = threading.Lock()

    def take(self, key: Hashable) -> object | None:
        """What the pass holds for `key` (an Observation or the error to raise), once."""
        with self._lock:
            held = self._held.pop(key, None)
        if held is None or time.monotonic() - held[0] > self.max_age_s:
            return None
        return held[1]

    def offer(self, key: Hashable, value: object) -> None:
        """Hold what was read for `key` until its net asks."""
        with self._lock:
            self._held[key] = (time.monotonic(), value)
            self._read.add(key)

    def mark_read(self, key: Hashable) -> None:
        """`key` was read in this pass (so no batch reads it again for a neighbour)."""
        with self._lock:
            self._read.add(key)

    def was_read(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._read

    def forget(self, key: Hashable) -> None:
        """`key` changed (it was scaled): what the pass holds for it is stale."""
        with self._lock:
            self._held.pop(key, None)


_current: ContextVar[ObservationPass | None] = ContextVar("observation_pass", default=None)


def current_pass() -> ObservationPass | None:
    """The observation pass this thread is in, if any."""
    return _current.get()


@contextmanager
def observation_pass(order: Sequence[str] = ()) -> Iterator[ObservationPass]:
    """Run the block as one observation pass (a pass already open is kept). Context-local:
    other threads, and tasks started from here, are not in it."""
    existing = _current.get()
    if existing is not None:
        yield existing
        return
    opened = ObservationPass(order)
    token = _current.set(opened)
    try:
        yield opened
    finally:
        _current.reset(token)

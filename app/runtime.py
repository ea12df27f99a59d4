"""Per-process wiring: settings, the database, and one driver and admin client per net.

Built once per process (worker child, beat, status API, CLI) and passed to use cases.
Adapters are created lazily, so a process that never touches a net never builds its
boto3 client or NVFLARE session, and a forked worker child builds its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, cast

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.adapters import net_check
from app.adapters.backend import AdminClient
from app.adapters.callbacks import CallbackSender
from app.adapters.drivers import Observation, ScaleDriver, build_driver
from app.adapters.drivers.base import ObservationPass, observation_pass
from app.db import make_engine, session_factory
from app.net_config import NetConfig
from app.parallel import ProbeResult, Sequential
from app.settings import Settings
from models import utcnow

log = logging.getLogger(__name__)

DriverFactory = Callable[[NetConfig, Settings], ScaleDriver]
AdminFactory = Callable[[NetConfig, Settings], AdminClient]


def _build_admin(net: NetConfig, settings: Settings) -> AdminClient:
    """The client of the net's backend (imported only when a net uses it); mypy checks here
    that each satisfies the interface."""
    if net.backend == "flower":
        from app.adapters.flower.client import build_flower_client

        return build_flower_client(net, settings)
    from app.adapters.nvflare.client import build_admin_client

    return build_admin_client(net, settings)


class FanOut(Protocol):
    """Runs one call per key and returns each one's value or error (see app.parallel)."""

    def run(
        self, calls: Mapping[str, Callable[[], Any]], timeout_s: float
    ) -> dict[str, ProbeResult]:
        """Run the calls; those not done by the deadline are reported as timed out."""
        ...


class Outbox(Protocol):
    """Where use cases send follow-up work after their transaction has committed."""

    def send(self, task: str, **kwargs: Any) -> bool:
        """Send one task by name with JSON kwargs; False (logged) if the broker refused."""
        ...

    def start_pipeline(self, job_id: str, net_name: str, attempt: int) -> bool:
        """Start scale_up -> wait_ready -> dispatch for a claimed job's attempt; False
        (logged) if the broker refused."""
        ...


@dataclass
class RecordingOutbox:
    """Keeps what would have been sent: the default until a Celery app is wired, and the
    outbox of unit tests. Losing a message loses nothing: the reconciler finds the row."""

    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def send(self, task: str, **kwargs: Any) -> bool:
        """Record a task send."""
        self.sent.append((task, kwargs))
        return True

    def start_pipeline(self, job_id: str, net_name: str, attempt: int) -> bool:
        """Record a pipeline start."""
        ids = {"job_id": job_id, "net_name": net_name, "attempt": attempt}
        self.sent.append(("pipeline", ids))
        return True


@dataclass
class Runtime:
    """What a process needs to run use cases; adapters are injectable for unit tests."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    clock: Callable[[], datetime] = utcnow
    # Seconds for a budget within one call (a callback round's): never stepped, unlike
    # `clock`; the simulator drives it from its own time.
    monotonic: Callable[[], float] = time.monotonic
    driver_factory: DriverFactory = build_driver
    admin_factory: AdminFactory = _build_admin
    outbox: Outbox = field(default_factory=RecordingOutbox)
    # How housekeeping talks to many servers at once: a bounded parallel Prober in a worker,
    # in-line (deterministic) in unit tests and the simulator.
    fan_out: FanOut = field(default_factory=Sequential)
    # Where callback rounds post (None: HTTP to CALLBACK_URL); the simulator's receiver.
    callback_sender: CallbackSender | None = None
    _drivers: dict[str, ScaleDriver] = field(default_factory=dict)
    _admins: dict[str, AdminClient] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: object) -> Runtime:
        """Wire a runtime for `settings` (one engine per process)."""
        engine = make_engine(settings.database_url)
        return cls(settings=settings, engine=engine, sessions=session_factory(engine), **overrides)  # type: ignore[arg-type]

    def driver(self, net_name: str) -> ScaleDriver:
        """The net's scale driver, built on first use."""
        with self._lock:
            if net_name not in self._drivers:
                self._drivers[net_name] = self.driver_factory(
                    self.settings.net(net_name), self.settings
                )
            return self._drivers[net_name]

    def observation_pass(
        self, order: Sequence[str] = ()
    ) -> AbstractContextManager[ObservationPass]:
        """A block in which many nets are observed (see drivers.base.ObservationPass): ECS
        nets then cost one DescribeServices call per 10."""
        return observation_pass(order)

    def observe_many(self, names: Sequence[str]) -> dict[str, Observation | Exception]:
        """Observe these nets in one pass; a net's failure is its own entry."""
        results: dict[str, Observation | Exception] = {}
        with observation_pass(names):
            for name in names:
                try:
                    results[name] = self.driver(name).observe()
                except Exception as exc:  # noqa: BLE001 - reported per net, as a probe's error
                    results[name] = exc
        return results

    def observation_batches(self, names: Iterable[str], size: int = 10) -> list[list[str]]:
        """The nets grouped as `observe_many` reads them in one platform call (nets whose
        drivers share a `batch_key`, `size` at a time); any other net alone."""
        batches: list[list[str]] = []
        open_batches: dict[object, list[str]] = {}
        for name in names:
            try:
                key = getattr(self.driver(name), "batch_key", None)
            except Exception:  # noqa: BLE001 - observing it alone reports the error per net
                key = None
            if key is None:
                batches.append([name])
                continue
            batch = open_batches.get(key)
            if batch is None or len(batch) == size:
                batch = open_batches[key] = []
                batches.append(batch)
            batch.append(name)
        return batches

    def admin(self, net_name: str) -> AdminClient:
        """The net's admin client, built on first use (it connects lazily itself); one that
        refuses every call while this process's files for the net name another server."""
        wrong = net_check.found_wrong(net_name)
        if wrong is not None:
            return cast(AdminClient, net_check.RefusingAdmin(wrong))
        with self._lock:
            if net_name not in self._admins:
                self._admins[net_name] = self.admin_factory(
                    self.settings.net(net_name), self.settings
                )
            return self._admins[net_name]

    def forget_admin(self, net_name: str) -> None:
        """Close and drop the net's admin client if one exists (its server is going away)."""
        with self._lock:
            client = self._admins.pop(net_name, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        """Close every admin session and the engine, so the process exits promptly."""
        with self._lock:
            admins = list(self._admins.values())
            self._admins.clear()
        for client in admins:
            try:
                client.close()
            except Exception:  # closing must never stop the others from closing
                log.exception("closing an admin client failed")
        self.engine.dispose()

"""The scale-driver interface: how a net's fl-server gets 0 or 1 replicas."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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

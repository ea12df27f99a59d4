"""The backend interface under its old NVFLARE name: it moved to `app.adapters.backend`
(issue 38), where a Flower net's client satisfies it too. Kept one release for imports
from outside this repository; nothing here imports it."""

from __future__ import annotations

from app.adapters.backend import (
    AbortOutcome,
    AbortResult,
    AdminClient,
    BackendClient,
    Readiness,
    RunState,
    RunStatus,
    ServerState,
)

__all__ = [
    "AbortOutcome",
    "AbortResult",
    "AdminClient",
    "BackendClient",
    "Readiness",
    "RunState",
    "RunStatus",
    "ServerState",
]

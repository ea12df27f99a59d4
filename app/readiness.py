"""Is this process's world reachable? The database answers and the broker accepts a
connection: what GET /readyz and `fl-dispatcher ready` (a healthcheck) both report.

Both checks run in parallel with one deadline, so a black-holed broker cannot make a
healthcheck hang past it.
"""

from __future__ import annotations

from functools import partial

from sqlalchemy import Engine, text

from app.parallel import Prober

# Key prefix in the Prober: an API's Prober also holds the per-net probes.
_KEY = "ready:"


def check_database(engine: Engine) -> None:
    """SELECT 1 on a pooled connection."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def check_broker(broker_url: str, timeout_s: float) -> None:
    """One connection attempt to the broker, no retry loop."""
    from kombu.connection import Connection

    connection = Connection(broker_url, connect_timeout=timeout_s)  # type: ignore[no-untyped-call]
    with connection as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout_s)


def check_ready(
    engine: Engine, broker_url: str, prober: Prober, timeout_s: float
) -> dict[str, str | None]:
    """{"database": error or None, "broker": error or None} within `timeout_s`."""
    results = prober.run(
        {
            f"{_KEY}database": partial(check_database, engine),
            f"{_KEY}broker": partial(check_broker, broker_url, timeout_s),
        },
        timeout_s,
    )
    return {key.removeprefix(_KEY): r.error for key, r in results.items()}

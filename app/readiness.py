"""Is this process's world reachable? The database answers and the broker accepts a
connection: what GET /readyz and `fl-dispatcher ready` (a healthcheck) both report.

Both checks run in parallel with one deadline, so a black-holed broker cannot make a
healthcheck hang past it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

from kombu.exceptions import KombuError
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from app.errors import DispatcherError
from app.parallel import Prober
from app.settings import Settings

log = logging.getLogger(__name__)

WAIT_POLL_S = 2.0

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


class DependencyTimeout(DispatcherError):
    """What a process waited for at start did not come within its time."""


def missing_dependencies(
    engine: Engine,
    broker_url: str | None,
    *,
    schema: bool,
    timeout_s: float = 3.0,
    known_schema: bool = False,
) -> list[str]:
    """What is not there yet: the database, its schema at the migrations' head (`schema`)
    or at least at none newer than this code's (`known_schema`: `db upgrade`, which brings
    an older one to head but can take no newer one down), the broker (unless `broker_url`
    is None). Empty when everything is."""
    from app.migrate import newer_schema, schema_problem

    missing = []
    try:
        check_database(engine)
        problem = (
            schema_problem(engine) if schema else newer_schema(engine) if known_schema else None
        )
        if problem is not None:
            missing.append(f"database schema: {problem}")
    except SQLAlchemyError as exc:
        missing.append(f"database: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    if broker_url is not None:
        try:
            check_broker(broker_url, timeout_s)
        except (KombuError, OSError) as exc:
            missing.append(f"broker: {type(exc).__name__}: {exc}")
    return missing


def wait_for_dependencies(
    settings: Settings,
    timeout_s: float,
    *,
    schema: bool,
    broker: bool,
    known_schema: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Retry until the database (at the migrations' head if `schema`, at no newer revision
    if `known_schema`) and the broker (if `broker`) answer; DependencyTimeout naming what is
    missing after `timeout_s`.

    Why a process waits itself: an engine may start every container at once (podman ignores
    compose's `depends_on` conditions), and a process that exits on a missing dependency
    only shows up as a restart loop."""
    from app.db import make_engine

    engine = make_engine(settings.database_url)
    deadline = clock() + timeout_s
    try:
        while True:
            missing = missing_dependencies(
                engine,
                settings.broker_url if broker else None,
                schema=schema,
                known_schema=known_schema,
            )
            if not missing:
                return
            if clock() >= deadline:
                raise DependencyTimeout(
                    f"still missing after {timeout_s:.0f}s: " + "; ".join(missing)
                )
            log.info("waiting for: %s", "; ".join(missing))
            sleep(WAIT_POLL_S)
    finally:
        engine.dispose()

"""Engine and unit of work. The SQL database is the source of truth for jobs and nets."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url`; SQLite gets the settings that make it safe for several processes."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)
        _sqlite_immediate_transactions(engine)
        return engine
    kwargs["connect_args"] = connect_args(url) | kwargs.get("connect_args", {})
    engine = create_engine(url, pool_pre_ping=True, **kwargs)
    _postgres_utc_sessions(engine)
    return engine


# A PostgreSQL that accepts the connection and never answers (a blackholed host behind a load
# balancer, a server hung at startup) would hold a task, or a worker's start, as long as the
# operating system's TCP timers allow: minutes. Long enough for a failover's new primary.
CONNECT_TIMEOUT_S = 10


def connect_args(url: str) -> dict[str, Any]:
    """The driver's connection arguments for a PostgreSQL `url`: a connect timeout, unless
    the URL names its own (`?connect_timeout=`)."""
    if "connect_timeout" in make_url(url).query:
        return {}
    return {"connect_timeout": CONNECT_TIMEOUT_S}


def _postgres_utc_sessions(engine: Engine) -> None:
    # Each new connection's session speaks UTC, whatever the server's TimeZone: psycopg then
    # hands back timestamps with `datetime.UTC` itself, which models.base.TZDateTime passes
    # through as they are, where a server zone (even Etc/UTC) costs two zone conversions per
    # value (issue 37: a third of reconcile's read of 1,000 nets). A SET, not a startup
    # option: connection poolers such as RDS Proxy refuse startup options.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True  # a SET outside any transaction, kept by the session
        cursor = dbapi_conn.cursor()
        cursor.execute("SET TIME ZONE 'UTC'")
        cursor.close()
        dbapi_conn.autocommit = autocommit


def _sqlite_immediate_transactions(engine: Engine) -> None:
    # SQLite ignores FOR UPDATE. Taking the write lock at BEGIN (BEGIN IMMEDIATE) serialises
    # claimers across processes, so read-then-claim cannot race there; PostgreSQL uses row
    # locks with SKIP LOCKED instead. WAL lets readers (status API) run beside one writer.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let us issue BEGIN ourselves
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def missing_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL that does not exist yet (None for any other database, or a
    file that is there): opening it would create it, and its folder."""
    if not url.startswith("sqlite"):
        return None
    path = url.split("///", 1)[-1].split("?", 1)[0]
    if not path or path == ":memory:" or Path(path).exists():
        return None
    return Path(path)


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    """One engine (and pool) per URL per process."""
    return make_engine(url)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (we pass ids, not objects, anyway)."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def unit_of_work(factory: sessionmaker[Session]) -> Iterator[Session]:
    """Commit on success, roll back on any error, always close."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# SQLSTATE classes and codes that say "not now" rather than "never": a connection lost or
# refused (08), too many connections or out of resources (53), an administrator's or a
# crash's shutdown, a server still starting (57P01-57P05), a serialisation failure or a
# deadlock (40001, 40P01), a server that takes no writes (25006: a demoted primary or a
# standby during a failover), a lock not available (55P03), and a schema the code is ahead
# of (42P01 undefined table, 42703 undefined column, 3D000 no such database: a deployment
# whose migration has not run yet, which retrying keeps the request for).
_NOT_NOW = ("08", "53", "57P", "40001", "40P01", "25006", "55P03", "42P01", "42703", "3D000")


def database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database could not do the work now (refused or lost the
    connection, restarting, failing over, read-only, locked, out of pooled connections, a
    deadlock or serialisation failure, a schema not migrated yet), so the same request may
    succeed later; not a bad request."""
    if isinstance(exc, DBAPIError):
        # OperationalError is what every driver raises for the server's side of things
        # (psycopg: connection refused or reset, admin shutdown, "the database system is
        # starting up", deadlocks; sqlite3: "database is locked", and also a schema that is
        # behind the code). PostgreSQL's other classes are read by their SQLSTATE.
        if exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError):
            return True
        code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        return isinstance(code, str) and code.startswith(_NOT_NOW)
    return isinstance(exc, PoolTimeout | DisconnectionError)


def database_error_name(exc: BaseException) -> str:
    """What a log line may say of a database error: its class and SQLSTATE, never its text
    (a driver's message can quote the statement and its parameters)."""
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    name = type(orig).__name__ if orig is not None else type(exc).__name__
    return f"{name} ({code})" if code else name

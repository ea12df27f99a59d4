"""Engine and unit of work. The SQL database is the source of truth for jobs and nets."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
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
    return create_engine(url, pool_pre_ping=True, **kwargs)


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


def database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database could not do the work now (refused or lost the
    connection, restarting, failing over, locked, out of pooled connections, a deadlock or
    serialisation failure), so the same request may succeed later; not a bad request."""
    if isinstance(exc, DBAPIError):
        # OperationalError is what every driver raises for the server's side of things
        # (psycopg: connection refused or reset, admin shutdown, "the database system is
        # starting up", deadlocks; sqlite3: "database is locked", and also a schema that is
        # behind the code, which a retry keeps until the migration has run).
        return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)
    return isinstance(exc, PoolTimeout | DisconnectionError)


def database_error_name(exc: BaseException) -> str:
    """What a log line may say of a database error: its class and SQLSTATE, never its text
    (a driver's message can quote the statement and its parameters)."""
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    name = type(orig).__name__ if orig is not None else type(exc).__name__
    return f"{name} ({code})" if code else name

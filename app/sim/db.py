"""The simulation's database: the schema is built ONCE per process by the real Alembic
migrations into a template file, and every simulation gets an in-memory copy of it (SQLite's
backup API, well under a millisecond), bound to one connection the whole run shares."""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import tempfile
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import StaticPool

from app import migrate


class _Scratch:
    root: Path | None = None
    template: Path | None = None
    pid: int | None = None


# Memory-backed where the system has it: the dispatcher's own code writes and removes a
# prepared copy of every job's folder (app.adapters.jobdefs), and on a disk each mkdir and
# rmdir went through the journal (about a seventh of a replay's time under load).
# mkdtemp makes a private (0700) folder of its own there, as in the system's temp folder.
_SHM = Path("/dev/shm")  # noqa: S108


# A container's /dev/shm is often 64 MiB: below this much free space, the disk is used.
_SHM_MIN_FREE = 1 << 30


def _scratch_parent() -> str | None:
    """_SHM when it is a writable folder with room, else the system's temporary folder."""
    if not (_SHM.is_dir() and os.access(_SHM, os.W_OK | os.X_OK)):
        return None
    stats = os.statvfs(_SHM)
    return str(_SHM) if stats.f_bavail * stats.f_frsize >= _SHM_MIN_FREE else None


def scratch_dir() -> Path:
    """A per-process folder for the template database, admin kits and job folders (a
    forked worker makes its own, and keeps its parent's template: it is only read), in
    memory where the system allows. Removed when the process ends: atexit, and, for a
    forked worker (which ends without atexit), multiprocessing's finalizers."""
    if _Scratch.root is None or _Scratch.pid != os.getpid():
        root = Path(tempfile.mkdtemp(prefix="fl-sim-", dir=_scratch_parent()))
        atexit.register(shutil.rmtree, root, True)
        Finalize(None, shutil.rmtree, args=(root, True), exitpriority=0)
        _Scratch.root, _Scratch.pid = root, os.getpid()
    return _Scratch.root


def template_db() -> Path:
    """The migrated (alembic upgrade head) template database of this process (or of the
    process it was forked from)."""
    root = scratch_dir()
    if _Scratch.template is None:
        path = root / "template.db"
        migrate.upgrade(f"sqlite:///{path}")
        _Scratch.template = path
    return _Scratch.template


class _Shared:
    """The process's one engine, bound to the current simulation's connection: SQLAlchemy
    caches compiled statements per engine, so a new engine per seed compiled every
    statement of every use case again (about a tenth of a seed's time)."""

    engine: Engine | None = None
    conn: sqlite3.Connection | None = None
    pid: int | None = None


def memory_db() -> tuple[Engine, sqlite3.Connection]:
    """A fresh in-memory copy of the template, and its single shared connection, behind
    the process's engine (its pool now hands out this connection).

    Transactions start with BEGIN IMMEDIATE, as app.db configures SQLite, so a use case's
    read-then-write runs under the write lock exactly as in the embedded deployment.
    """
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    source = sqlite3.connect(template_db())
    try:
        source.backup(conn)
    finally:
        source.close()
    _Shared.conn = conn
    if _Shared.engine is None or _Shared.pid != os.getpid():
        _Shared.engine, _Shared.pid = _engine(), os.getpid()
    else:
        _Shared.engine.dispose(close=False)  # the next checkout asks the creator: `conn`
    return _Shared.engine, conn


def _engine() -> Engine:
    def creator() -> sqlite3.Connection:
        assert _Shared.conn is not None
        return _Shared.conn

    # No reset on return: every Session ends its own transaction (commit, or rollback on
    # close), so the pool's extra ROLLBACK per checkout would only cost time.
    engine = create_engine(
        "sqlite://", creator=creator, poolclass=StaticPool, pool_reset_on_return=None
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA foreign_keys=ON")

    @event.listens_for(engine, "begin")
    def _on_begin(_connection: Any) -> None:
        # Straight to the one DBAPI connection: SQLAlchemy's exec_driver_sql costs a whole
        # statement execution (cursor, result, events) for every transaction.
        assert _Shared.conn is not None
        _Shared.conn.execute("BEGIN IMMEDIATE")

    return engine


class Unchanged:
    """Whether the simulation's one connection wrote a row since a reader's last read
    (`total_changes`: every INSERT, UPDATE and DELETE, a trigger's too, rolled back or not),
    so a read repeated after every step can be skipped or its rows kept. A read made inside
    an open transaction is never kept: a rollback may undo what it saw without moving the
    counter."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._at: int | None = None

    def holds(self) -> bool:
        """True: nothing was written since the last call that said False, whose read still
        holds; False: read again (this call marks the counter for the next one)."""
        conn = self._conn
        changes = conn.total_changes
        if changes == self._at and not conn.in_transaction:
            return True
        self._at = None if conn.in_transaction else changes
        return False

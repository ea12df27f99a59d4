"""A database that fails a statement or a commit (FaultProfile.db_error): what psycopg
raises when PostgreSQL restarts, fails over or resets the connection, a
`sqlalchemy.exc.OperationalError`, at any statement or commit a handler makes, on a stream
of its own (`f"{seed}/db"`: the other worlds run as before).

What it must not do: lose a caller's request (a `request` handler's message is retried, not
acknowledged away: `request-lost`), stop a loop for good, or leave half a change behind. A
housekeeping round, a chain step, an assign round or a callback round that fails with it is
excused (`excused`): the next tick, reconcile or beat's sweep does its work, which the
liveness bounds check."""

from __future__ import annotations

import random
import sqlite3
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import OperationalError

from app.handlers import Kind
from app.sim.simulation import Simulation

DB_ERROR = "sim: server closed the connection unexpectedly"
# The kinds whose work another message redoes: their failure on a database error is excused.
REDONE = (Kind.HOUSEKEEPING, Kind.PIPELINE, Kind.PLAIN, Kind.CALLBACKS)


class DatabaseFaults:
    """Fails statements and commits the workers of `sim` make on `engine` until `remove`;
    the harness's own reads and writes are never failed."""

    def __init__(self, sim: Simulation, engine: Engine, seed: int) -> None:
        self._sim = sim
        self._engine = engine
        self._rng = random.Random(f"{seed}/db")
        event.listen(engine, "before_cursor_execute", self._on_statement)
        event.listen(engine, "commit", self._on_commit)

    def _fails(self) -> bool:
        rate = self._sim.faults.db_error
        # The harness's own work (a worker's start) is never failed.
        if not rate or self._sim.starting_worker or not self._sim.running:
            return False
        return self._rng.random() < rate

    def _failed(self) -> None:
        """What the handler read of a run's end so far is not written (simulation seed
        2348: a monitor round read a run's end and failed to write it; the server lost its
        record in a restart, and the job rightly ran again): it did not see that end."""
        reader = self._sim.reader()
        if reader is not None:
            self._sim.cluster.unsee_reads(reader)

    def _on_statement(self, *_args: Any, **_kwargs: Any) -> None:
        if self._fails():
            self._sim.trace("   !! database error at a statement (simulated)")
            self._failed()
            raise sqlite3.OperationalError(DB_ERROR)  # wrapped as SQLAlchemy's, as psycopg's

    def _on_commit(self, conn: Any) -> None:
        if not self._fails():
            return
        # The connection dies during COMMIT: the server either never got it (the
        # transaction is gone with the session) or committed and the reply was lost; the
        # client cannot tell which, and neither may the code.
        dbapi = conn.connection.dbapi_connection
        applied = self._rng.random() < 0.5
        if applied:
            dbapi.commit()
        else:
            dbapi.rollback()
        what = "its reply lost" if applied else "not applied"
        if not applied:
            self._failed()
        self._sim.trace(f"   !! database error at a commit, {what} (simulated)")
        raise OperationalError("COMMIT", None, sqlite3.OperationalError(DB_ERROR))

    def remove(self) -> None:
        """Take the listeners off the process's shared engine."""
        event.remove(self._engine, "before_cursor_execute", self._on_statement)
        event.remove(self._engine, "commit", self._on_commit)


def excused(kind: str, exc: BaseException) -> bool:
    """A simulated database error out of a handler whose work another message redoes."""
    return kind in REDONE and DB_ERROR in str(exc)

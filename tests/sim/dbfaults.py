"""A database that fails a statement or a commit (FaultProfile.db_error): what psycopg
raises when PostgreSQL restarts, fails over or resets the connection, a
`sqlalchemy.exc.OperationalError`, at any statement or commit a handler makes, on a stream
of its own (`f"{seed}/db"`: the other worlds run as before).

Round 16, time limits: in bands of the first draw of `f"{seed}/db/hang"` (none of the
safeguards' and sweep-seed tests' db-fault seeds in them, so those worlds replay exactly),
half the failed statements a handler makes (`Delivery.in_handler`: not a worker's start or
its ready kick, which no time limit bounds) hang instead, drawn on that stream: to the
task's soft time limit (billiard's SoftTimeLimitExceeded out of the statement), or, in half
of those, past it to the hard limit, where Celery's pool kills the task's process
(`TimeLimitKilled`; the statement stuck in C, where the soft limit's signal cannot reach
it). Every kind may hang: a request must be retried at the soft limit and requeued at the
hard one (`request-lost` else); the others fail or are acknowledged, excused as a database
error is. The hang's time is not spent: the statement holds a transaction, and nothing may
run meanwhile on the one connection.

What it must not do: lose a caller's request (a `request` handler's message is retried, not
acknowledged away: `request-lost`), stop a loop for good, or leave half a change behind. A
housekeeping round, a chain step, an assign round or a callback round that fails with it is
excused (`excused`): the next tick, reconcile or beat's sweep does its work, which the
liveness bounds check."""

from __future__ import annotations

import random
import sqlite3
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from sqlalchemy import Engine, event
from sqlalchemy.exc import OperationalError

from app.handlers import HANDLERS, Kind
from app.sim.interleaving import TimeLimitKilled
from app.sim.simulation import Simulation

DB_ERROR = "sim: server closed the connection unexpectedly"
HUNG = "sim: a statement hung to the soft time limit"
# The first draw of `f"{seed}/db/hang"` that gives a db-fault world its hangs (about 43% of
# them): bands none of the named seeds' draws falls in (tests/unit/test_sweep_seeds.py,
# test_*safeguards.py, test_*_sim.py, test_simulation.py's forced racy and chaos 0-3).
HANG_BANDS = (
    (0.0000, 0.0311),
    (0.0473, 0.0931),
    (0.0951, 0.1530),
    (0.1550, 0.1986),
    (0.4736, 0.5608),
    (0.7009, 0.7676),
    (0.8661, 0.9685),
)
HANG_P = 0.5  # a failed statement of a band world hangs rather than fails
KILLED_P = 0.5  # a hang that outlasts the soft limit to the hard one
# The kinds whose work another message redoes: their failure on a database error is excused.
REDONE = (Kind.HOUSEKEEPING, Kind.PIPELINE, Kind.PLAIN, Kind.CALLBACKS)


class DatabaseFaults:
    """Fails statements and commits the workers of `sim` make on `engine` until `remove`;
    the harness's own reads and writes are never failed."""

    def __init__(self, sim: Simulation, engine: Engine, seed: int) -> None:
        self._sim = sim
        self._engine = engine
        self._rng = random.Random(f"{seed}/db")
        hang = random.Random(f"{seed}/db/hang")
        first = hang.random()
        self._hang = hang if any(lo <= first < hi for lo, hi in HANG_BANDS) else None
        event.listen(engine, "before_cursor_execute", self._on_statement)
        event.listen(engine, "commit", self._on_commit)
        event.listen(engine, "handle_error", self._kept_connection)

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
        if not self._fails():
            return
        # Only a task's own statement has a time limit (a worker's ready kick has none).
        hang = self._hang if self._sim.delivery.in_handler() else None
        if hang is not None and hang.random() < HANG_P:
            self._failed()
            self._count_hang()
            if hang.random() < KILLED_P:
                self._sim.trace("   !! a statement hung to the hard time limit (simulated)")
                raise TimeLimitKilled("a statement hung past the hard time limit")
            self._sim.trace("   !! a statement hung to the soft time limit (simulated)")
            raise SoftTimeLimitExceeded(HUNG)
        self._sim.trace("   !! database error at a statement (simulated)")
        self._failed()
        raise sqlite3.OperationalError(DB_ERROR)  # wrapped as SQLAlchemy's, as psycopg's

    def _count_hang(self) -> None:
        stats, current = self._sim.stats, self._sim.current
        stats["hangs"] = stats.get("hangs", 0) + 1
        if current and HANDLERS[current[-1].task].kind is Kind.REQUEST:
            stats["request hangs"] = stats.get("request hangs", 0) + 1

    @staticmethod
    def _kept_connection(context: Any) -> None:
        """A process killed at a statement is no disconnect: SQLAlchemy would take a
        BaseException for one and close the connection, the seed's one in-memory database."""
        if isinstance(context.original_exception, TimeLimitKilled):
            context.is_disconnect = False

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
        event.remove(self._engine, "handle_error", self._kept_connection)


def excused(kind: str, exc: BaseException) -> bool:
    """A simulated database error or hang out of a handler whose work another message redoes."""
    return kind in REDONE and (DB_ERROR in str(exc) or HUNG in str(exc))

"""A commit PostgreSQL applied whose reply was lost (the connection reset during COMMIT):
the client sees an OperationalError though the change is stored, and a request's retry
(`app.handlers.on_error`: RETRY) runs on the stored change. The same fault the simulator
injects (`tests.sim.dbfaults`), once, at a chosen commit."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import OperationalError


@contextlib.contextmanager
def commit_reply_lost(engine: Engine, at: int = 1) -> Iterator[list[int]]:
    """The `at`-th commit made on `engine` inside the block is applied, then raises as a
    lost connection; the others go through. Yields the count of commits seen."""
    seen = [0]

    def on_commit(conn: Any) -> None:
        seen[0] += 1
        if seen[0] == at:
            conn.connection.dbapi_connection.commit()
            raise OperationalError(
                "COMMIT", None, sqlite3.OperationalError("server closed the connection")
            )

    event.listen(engine, "commit", on_commit)
    try:
        yield seen
    finally:
        event.remove(engine, "commit", on_commit)

"""The embedded broker's table stays bounded: every worker on kombu's SQLAlchemy transport
(`sqla+...`, the embedded default `sqla+sqlite:///<data dir>/broker.db`) deletes, as its
consumer starts and then every `PRUNE_EVERY_S`, the message rows consumers took more than
`CONSUMED_KEPT_S` ago.

Why (measured with kombu 5.7.0, SQLAlchemy 2.1): kombu's transport never deletes a message it
delivers. `Channel._get` only marks the row `visible = false` (its `timestamp` column, `onupdate
datetime.now`, becomes the time it was taken) and keeps it; nothing in kombu removes it later
except a purge. An embedded `worker --beat` at the local stack's `HOUSEKEEPING_INTERVAL_S=2`
added 2.7 rows (3.8 KB) a second: some 230,000 rows and 330 MB a day, for ever.

Deleting such a row can never lose a message. kombu reads only `visible = true` rows (`_get`,
`_size`); a taken message lives on in its consumer's memory (`virtual.QoS._delivered`) until
it is acknowledged, and an unacknowledged one goes back to the broker as a NEW visible row
(`QoS.restore_unacked` on the channel's close, `reject(requeue=True)`: both `_restore` ->
`_put`); kombu never turns a row visible again, so a worker that dies as a whole loses its
taken messages whether or not their rows remain (step leases and reconcile cover that). Rows
not yet taken (`visible = true`) are never touched. Keeping taken rows for `CONSUMED_KEPT_S`
anyway leaves the last minutes' traffic readable in the file, and bounds the table at about
`CONSUMED_KEPT_S + PRUNE_EVERY_S` of traffic: some 1,800 rows (2.5 MB) at the local stack's
rate (measured with both shortened to 20 s and 10 s: 57-61 rows and a 148 KB file for two
minutes, where the same run without the prune reached 330 rows and 496 KB, still growing).

SQLite does not shrink its file on a delete: the freed pages are reused by the next inserts,
so the file stays at its high-water mark, which is bounded; no VACUUM is needed (nor wanted:
it would lock the broker while it rewrites the file).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from celery import bootsteps
from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Integer,
    MetaData,
    Table,
    create_engine,
    delete,
    false,
    select,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

log = logging.getLogger(__name__)

# How long a taken message's row stays, and how often a worker deletes older ones.
CONSUMED_KEPT_S = 600
PRUNE_EVERY_S = 60
# Rows per DELETE: each one a short write transaction (about 40 ms on SQLite), so a prune
# never holds the write lock long enough to time out a publisher (kombu's SQLite connections
# wait 5 s). At most BATCHES_PER_RUN of them a round: a first prune of a large table (an
# upgrade from a release that never pruned, 230,000 rows a day) takes it in rounds of about
# a second, not one long stall of the worker's timer thread, which also runs ETA messages.
BATCH = 1000
BATCHES_PER_RUN = 20

# kombu's URL prefixes for its SQLAlchemy transport (kombu.transport.TRANSPORT_ALIASES).
SQL_PREFIXES = ("sqla+", "sqlalchemy+")

# The columns of kombu's message table (kombu/transport/sqlalchemy/models.py, default
# `message_tablename`) that the prune reads.
_messages = Table(
    "kombu_message",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("visible", Boolean),
    Column("timestamp", DateTime),
)


def is_sql_broker(broker_url: str) -> bool:
    """True for a broker URL served by kombu's SQLAlchemy transport."""
    return broker_url.startswith(SQL_PREFIXES)


def prune_consumed(
    broker_url: str, *, kept_s: float = CONSUMED_KEPT_S, now: datetime | None = None
) -> int:
    """Delete the message rows consumers took more than `kept_s` ago (never a row not yet
    taken) from the SQL broker at `broker_url`, at most `BATCHES_PER_RUN` batches of `BATCH`;
    the number deleted."""
    # kombu stamps a taken row with naive local time (`datetime.now`), so the cutoff is too.
    cutoff = (now or datetime.now()) - timedelta(seconds=kept_s)
    taken_before = select(_messages.c.id).where(
        _messages.c.visible == false(), _messages.c.timestamp < cutoff
    )
    engine = create_engine(broker_url.split("+", 1)[1], poolclass=NullPool)
    deleted = 0
    try:
        for _ in range(BATCHES_PER_RUN):
            with engine.begin() as conn:
                batch = taken_before.order_by(_messages.c.id).limit(BATCH).subquery()
                count = conn.execute(
                    delete(_messages).where(_messages.c.id.in_(select(batch.c.id)))
                ).rowcount
            deleted += count
            if count < BATCH:
                break
    finally:
        engine.dispose()
    return deleted


def prune_logged(broker_url: str) -> None:
    """`prune_consumed`, its failure logged (the next round tries again), never raised."""
    try:
        deleted = prune_consumed(broker_url, kept_s=CONSUMED_KEPT_S)
    except SQLAlchemyError as exc:
        log.warning("broker prune failed, next in %s s: %r", PRUNE_EVERY_S, exc)
        return
    if deleted:
        log.debug("broker pruned", extra={"deleted": deleted})


class PruneConsumedMessages(bootsteps.StartStopStep):  # type: ignore[misc]
    """A consumer step: while a worker on a SQL broker consumes, its timer runs
    `prune_logged` at once and every `PRUNE_EVERY_S` (registered in `app.celery_app`)."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.entries: list[Any] = []

    def include_if(self, parent: Any) -> bool:
        """Only for kombu's SQLAlchemy transport (Redis drops a message once acknowledged)."""
        return is_sql_broker(str(parent.app.conf.broker_url))

    def start(self, parent: Any) -> None:
        """Prune at once, then every `PRUNE_EVERY_S`, on the worker's timer thread (the
        consumer's steps start after the pool and an embedded beat forked)."""
        args = (str(parent.app.conf.broker_url),)
        self.entries = [
            parent.timer.call_after(0.0, prune_logged, args),
            parent.timer.call_repeatedly(PRUNE_EVERY_S, prune_logged, args),
        ]

    def stop(self, parent: Any) -> None:
        """Cancel them (the consumer restarts its steps after a lost connection)."""
        for entry in self.entries:
            entry.cancel()
        self.entries = []

    shutdown = stop

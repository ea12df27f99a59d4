"""The embedded broker's table stays bounded (app/broker_pruning.py): kombu's real SQLAlchemy
transport on a real SQLite file, a real Celery timer; nothing faked."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery.utils.timer2 import Timer
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.utils.imports import symbol_by_name

from app import broker_pruning
from app.broker_pruning import is_sql_broker, prune_consumed
from app.celery_app import configure
from app.settings import Settings

QUEUE = Queue("fl", Exchange("fl"), routing_key="fl")  # type: ignore[no-untyped-call]
# The timer's first prune runs at once; this only bounds a failure's wait.
PRUNED_WAIT_S = 10.0


def publish(url: str, *bodies: str) -> None:
    with Connection(url) as conn:  # type: ignore[no-untyped-call]
        producer = conn.Producer()
        for body in bodies:
            producer.publish(body, exchange=QUEUE.exchange, routing_key="fl", declare=[QUEUE])


def consume_and_ack(url: str, count: int) -> list[str]:
    got: list[str] = []

    def on_message(body: str, message: Any) -> None:
        got.append(body)
        message.ack()

    conn = Connection(url)  # type: ignore[no-untyped-call]
    with conn, conn.Consumer(QUEUE, callbacks=[on_message]):  # type: ignore[no-untyped-call]
        while len(got) < count:
            conn.drain_events(timeout=5)  # type: ignore[no-untyped-call]
    return got


def rows(db: Path) -> tuple[int, int]:
    """(message rows, rows not yet taken)."""
    with sqlite3.connect(db) as conn:
        total, visible = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(visible), 0) FROM kombu_message"
        ).fetchone()
    return int(total), int(visible)


def age_taken_rows(db: Path, days: int = 1) -> None:
    """Every taken row as if taken `days` ago (kombu stamps the time a row is taken)."""
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE kombu_message SET timestamp = datetime(timestamp, ?) WHERE visible = 0",
            (f"-{days} days",),
        )


@pytest.fixture
def broker(tmp_path: Path) -> tuple[str, Path]:
    db = tmp_path / "broker.db"
    return f"sqla+sqlite:///{db}", db


def test_kombu_keeps_every_message_it_delivered(broker: tuple[str, Path]) -> None:
    # The premise (kombu 5.7): a delivered and acknowledged message's row stays, marked
    # taken. If kombu ever deletes it, the prune is no longer needed.
    url, db = broker
    publish(url, *(f"m{i}" for i in range(50)))
    assert len(consume_and_ack(url, 50)) == 50
    assert rows(db) == (50, 0)


@pytest.fixture
def timer() -> Iterator[Timer]:
    timer = Timer()  # what a worker without an event loop runs
    yield timer
    timer.stop()


def start_consumer_steps(url: str, tmp_path: Path, timer: Timer) -> list[Any]:
    """The consumer steps the app registered that a worker on `url` includes, started as its
    consumer starts them, on `timer`."""
    app = configure(Settings(FL_DISPATCHER_DATA_DIR=tmp_path / "data", BROKER_URL=url))
    parent = SimpleNamespace(app=app, timer=timer)
    started = []
    for name in app.steps["consumer"]:
        step = symbol_by_name(name)(parent)  # type: ignore[no-untyped-call]
        if step.include_if(parent):
            step.start(parent)
            started.append((step, parent))
    return started


def test_a_worker_on_the_embedded_broker_prunes_the_rows_consumers_took_long_ago(
    broker: tuple[str, Path], tmp_path: Path, timer: Timer
) -> None:
    url, db = broker
    publish(url, *(f"m{i}" for i in range(30)))
    consume_and_ack(url, 30)
    age_taken_rows(db)
    publish(url, "not-taken-yet")
    assert rows(db) == (31, 1)

    started = start_consumer_steps(url, tmp_path, timer)
    try:
        deadline = time.monotonic() + PRUNED_WAIT_S
        while rows(db) != (1, 1):
            # Without the prune the 30 taken rows stay for ever (230,000 a day in the demo).
            assert time.monotonic() < deadline, ("taken rows never pruned", rows(db))
            time.sleep(0.05)
    finally:
        for step, parent in started:
            step.stop(parent)
    assert consume_and_ack(url, 1) == ["not-taken-yet"]


def test_a_message_taken_but_not_acknowledged_is_delivered_again_after_the_prune(
    broker: tuple[str, Path],
) -> None:
    # Late acks: a worker holds a message it has not acknowledged. Its row is marked taken
    # (the prune may delete it); kombu gives the message back from the consumer's memory, as
    # a new row, when the channel closes (a warm shutdown, a lost connection).
    url, db = broker
    publish(url, "held", "waiting")
    holder = Connection(url)  # type: ignore[no-untyped-call]
    bound = QUEUE.bind(holder.default_channel)  # type: ignore[no-untyped-call]
    bound.declare()  # as a worker declares its queues: the message goes back by this binding
    held = bound.get(no_ack=False)
    assert held is not None and held.payload == "held"
    age_taken_rows(db, days=30)

    assert prune_consumed(url) == 1
    assert rows(db) == (1, 1)  # "waiting" untouched

    holder.release()  # type: ignore[no-untyped-call]  # closes the channel: the unacknowledged message goes back
    assert sorted(consume_and_ack(url, 2)) == ["held", "waiting"]
    assert rows(db) == (2, 0)


def test_a_message_taken_recently_stays_until_it_is_older_than_the_kept_time(
    broker: tuple[str, Path],
) -> None:
    url, db = broker
    publish(url, "m")
    consume_and_ack(url, 1)
    assert prune_consumed(url) == 0
    assert rows(db) == (1, 0)
    later = datetime.now() + timedelta(seconds=broker_pruning.CONSUMED_KEPT_S + 1)
    assert prune_consumed(url, now=later) == 1
    assert rows(db) == (0, 0)


def test_a_large_backlog_is_pruned_in_bounded_rounds(
    broker: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An upgrade from a release that never pruned: each round deletes at most
    # BATCHES_PER_RUN x BATCH rows, the next round goes on.
    monkeypatch.setattr(broker_pruning, "BATCH", 2)
    monkeypatch.setattr(broker_pruning, "BATCHES_PER_RUN", 2)
    url, db = broker
    publish(url, *(f"m{i}" for i in range(5)))
    consume_and_ack(url, 5)
    age_taken_rows(db)
    assert [prune_consumed(url) for _ in range(3)] == [4, 1, 0]
    assert rows(db) == (0, 0)


def test_only_a_sql_broker_is_pruned() -> None:
    assert is_sql_broker("sqla+sqlite:///data/broker.db")
    assert is_sql_broker("sqlalchemy+postgresql://h/db")
    assert not is_sql_broker("redis://localhost:6379/0")
    assert not is_sql_broker("rediss://localhost:6379/0")

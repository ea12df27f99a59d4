"""The shared Celery app as the doors use it: configure() and the outbox's sends."""

from __future__ import annotations

import json
import sqlite3

from app import names
from app.celery_app import CeleryOutbox, configure
from app.settings import Settings


def queued_tasks(broker_db, queue: str = names.QUEUE) -> list[str]:
    with sqlite3.connect(broker_db) as conn:
        rows = conn.execute(
            "SELECT m.payload FROM kombu_message m JOIN kombu_queue q ON m.queue_id = q.id"
            " WHERE q.name = ? ORDER BY m.id",
            (queue,),
        ).fetchall()
    return [json.loads(payload)["headers"]["task"] for (payload,) in rows]


def test_configure_with_another_broker_sends_there(tmp_path):
    # Celery binds its connection pool to the broker of the first send; a process that is
    # configured again (the CLI run twice in one process, tests) must follow the new URL.
    brokers = {name: tmp_path / f"{name}.db" for name in ("a", "b")}
    for name in ("a", "b", "a"):
        settings = Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path, BROKER_URL=f"sqla+sqlite:///{brokers[name]}"
        )
        assert CeleryOutbox(configure(settings)).send(names.ASSIGN_NEXT_JOB) is True
    assert queued_tasks(brokers["a"]) == [names.ASSIGN_NEXT_JOB] * 2
    assert queued_tasks(brokers["b"]) == [names.ASSIGN_NEXT_JOB]

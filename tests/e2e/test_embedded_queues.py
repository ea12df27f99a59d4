"""The embedded default keeps working with three queues: one `fl-dispatcher worker --beat`
(the demo's layout: no -Q, so every queue) on kombu's SQLAlchemy transport over SQLite and
the SQLite job store, no Redis, no PostgreSQL. flip-api's request, the chain's message and
beat's housekeeping each land on their own queue and are all consumed."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import migrate, names
from app.celery_app import CeleryOutbox, configure
from app.schemas import EnqueueJob
from app.settings import Settings
from tests.fixtures.burst import JOB_NAME

pytestmark = pytest.mark.e2e

WAIT_S = 90

# The worker reads these from its environment; the test builds the same Settings.
ENV_SETTINGS = {
    "FL_DISPATCHER_DATA_DIR",
    "JOB_ROOT",
    "HOUSEKEEPING_INTERVAL_S",
    "PER_JOB_FL_SERVER",
    "NETS",
}


def test_one_embedded_worker_consumes_every_queue(tmp_path: Path):
    kit = tmp_path / "kit"
    (kit / "startup").mkdir(parents=True)
    (kit / "startup" / "fed_admin.json").write_text("{}")
    (tmp_path / "jobs" / JOB_NAME).mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NETS", "DATABASE_URL"))}
    env |= {
        "FL_DISPATCHER_DATA_DIR": str(tmp_path / "data"),
        "JOB_ROOT": str(tmp_path / "jobs"),
        "HOUSEKEEPING_INTERVAL_S": "1",
        "PER_JOB_FL_SERVER": "false",
        "NETS": json.dumps(
            [
                {
                    "name": "net-1",
                    "driver": {"kind": "static"},
                    "admin": {"kit_dir": str(kit), "username": "admin"},
                    "required_sites": ["site-1"],
                }
            ]
        ),
    }
    for key in ("BROKER_URL", "CALLBACK_URL"):
        env.pop(key, None)  # the embedded defaults
    settings = Settings(**{k: v for k, v in env.items() if k in ENV_SETTINGS})
    assert settings.broker_url.startswith("sqla+sqlite:///")  # the embedded default
    broker_db = Path(settings.broker_url.removeprefix("sqla+sqlite:///"))
    migrate.upgrade(settings.database_url)

    worker = subprocess.Popen(
        [sys.executable, "-m", "app.entrypoints.cli", "worker", "--beat"],
        env=env,
        cwd=tmp_path,
        stdout=(tmp_path / "worker.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        outbox = CeleryOutbox(configure(settings))
        job = EnqueueJob(caller_key="embedded-1", definition=JOB_NAME, net="net-1")
        flip_api = configure(settings)
        flip_api.send_task(
            names.ENQUEUE_JOB, kwargs={"payload": job.model_dump()}, queue=names.QUEUE
        )
        assert outbox.send(names.SETTLE_STRAY_RUNS, net_name="net-1") is True

        deadline = time.monotonic() + WAIT_S
        while True:
            counts = queue_counts(broker_db)
            consumed = all(
                counts.get(q, (0, 0))[0] >= 1 and counts[q][1] == 0 for q in names.QUEUES
            )
            if consumed and job_count(settings.database_url) == 1:
                break
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (
                counts,
                (tmp_path / "worker.log").read_text()[-3000:],
            )
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def queue_counts(broker_db: Path) -> dict[str, tuple[int, int]]:
    """Per queue: (messages ever put there, messages not yet taken by a worker)."""
    if not broker_db.exists():
        return {}
    with sqlite3.connect(broker_db) as conn:
        rows = conn.execute(
            "SELECT q.name, COUNT(m.id), SUM(CASE WHEN m.visible THEN 1 ELSE 0 END)"
            " FROM kombu_queue q LEFT JOIN kombu_message m ON m.queue_id = q.id GROUP BY q.name"
        ).fetchall()
    return {name: (int(total), int(visible or 0)) for name, total, visible in rows}


def job_count(database_url: str) -> int:
    with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])

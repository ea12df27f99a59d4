"""The embedded default keeps working with three queues: one `fl-dispatcher worker --beat`
(the demo's layout: no -Q, so every queue) on kombu's SQLAlchemy transport over SQLite and
the SQLite job store, no Redis, no PostgreSQL. flip-api's request, the chain's message and
beat's housekeeping each land on their own queue and are all consumed, and the row of a
message taken a day ago is pruned (app/broker_pruning.py). A job already waiting when that
worker starts is claimed once it is ready, not at beat's first round. A worker whose idle
pool processes are SIGKILLed goes on consuming (app/worker_pool.py)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from kombu.connection import Connection
from kombu.entity import Exchange, Queue

from app import migrate, names
from app.celery_app import CeleryOutbox, configure
from app.db import make_engine, session_factory, unit_of_work
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases.enqueue import enqueue_job
from models import utcnow
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


def embedded_env(tmp_path: Path, interval_s: int) -> dict[str, str]:
    """The environment of one `fl-dispatcher worker --beat` on the embedded defaults, with one
    static net (its kit says nothing: no job here needs it to answer)."""
    kit = tmp_path / "kit"
    (kit / "startup").mkdir(parents=True)
    (kit / "startup" / "fed_admin.json").write_text("{}")
    (tmp_path / "jobs" / JOB_NAME).mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NETS", "DATABASE_URL"))}
    env |= {
        "FL_DISPATCHER_DATA_DIR": str(tmp_path / "data"),
        "JOB_ROOT": str(tmp_path / "jobs"),
        "HOUSEKEEPING_INTERVAL_S": str(interval_s),
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
    return env


def start_worker(
    tmp_path: Path, env: dict[str, str], args: tuple[str, ...] = ("--beat",)
) -> subprocess.Popen[bytes]:
    """`fl-dispatcher worker --beat` (or with `args`), its output in worker.log."""
    return subprocess.Popen(
        [sys.executable, "-m", "app.entrypoints.cli", "worker", *args],
        env=env,
        cwd=tmp_path,
        stdout=(tmp_path / "worker.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_one_embedded_worker_consumes_every_queue(tmp_path: Path):
    env = embedded_env(tmp_path, interval_s=1)
    settings = Settings(**{k: v for k, v in env.items() if k in ENV_SETTINGS})
    assert settings.broker_url.startswith("sqla+sqlite:///")  # the embedded default
    broker_db = Path(settings.broker_url.removeprefix("sqla+sqlite:///"))
    migrate.upgrade(settings.database_url)
    stale = consumed_long_ago(settings.broker_url, broker_db)

    worker = start_worker(tmp_path, env)
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
            # The worker prunes at its start the rows taken long ago (app/broker_pruning.py).
            pruned = stale not in queue_counts(broker_db)
            if consumed and pruned and job_count(settings.database_url) == 1:
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


def test_a_job_waiting_at_the_start_is_claimed_once_the_worker_is_ready(tmp_path: Path):
    """The job was stored while no worker ran (its kick lost with the broker, or a worker
    start requeued it); beat's first assign round is an hour away. The ready worker's kick
    claims it, sent after the pool and the embedded beat forked: neither inherits the
    connection (a send from worker_init left the embedded beat `channel disconnected`)."""
    env = embedded_env(tmp_path, interval_s=3600)
    settings = Settings(**{k: v for k, v in env.items() if k in ENV_SETTINGS})
    migrate.upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        with unit_of_work(session_factory(engine)) as session:
            payload = EnqueueJob(caller_key="waiting-1", definition=JOB_NAME, net="net-1")
            job_id = enqueue_job(session, settings, payload, utcnow()).job_id
    finally:
        engine.dispose()

    worker = start_worker(tmp_path, env)
    try:
        deadline = time.monotonic() + WAIT_S
        while job_state(settings.database_url, job_id) == "QUEUED":
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            # Without the ready kick, QUEUED until beat's round an hour away.
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    log = (tmp_path / "worker.log").read_text()
    assert "disconnected" not in log and "Traceback" not in log, log[-3000:]


# Worker start (imports, migrations checked, pool forked) and one enqueue on a loaded 2-core
# machine: seconds. The stalled pool of the bug never ran the message at all.
KILLED_WAIT_S = 30


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_worker_whose_idle_pool_processes_are_killed_goes_on_consuming(
    tmp_path: Path, concurrency: int
):
    """kombu's SQL transport has no event loop, so Celery runs billiard's plain pool: one task
    pipe shared by every pool process, read under one lock that an idle process holds while it
    waits. Every pool process SIGKILLed while idle (the OOM killer, a kill -9; killing them all
    makes sure the one holding the lock is among them): with billiard's own lock their
    replacements waited for it for ever, the worker lived on, and the message sent next was
    taken from the broker table and never run. The pool's own lock is released by the kernel
    with its holder (app/worker_pool.py), so the next enqueue is stored."""
    env = embedded_env(tmp_path, interval_s=3600)
    settings = Settings(**{k: v for k, v in env.items() if k in ENV_SETTINGS})
    assert settings.broker_url.startswith("sqla+sqlite:///")  # the embedded default
    migrate.upgrade(settings.database_url)
    log = tmp_path / "worker.log"

    worker = start_worker(tmp_path, env, ("--concurrency", str(concurrency)))
    try:
        deadline = time.monotonic() + WAIT_S
        while b" ready." not in log.read_bytes():
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)  # every pool process idle, waiting for a task (one holds the lock)
        killed = pool_processes(worker.pid)
        assert len(killed) == concurrency, killed
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while len(set(pool_processes(worker.pid)) - set(killed)) < concurrency:
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)

        job = EnqueueJob(caller_key="after-kill", definition=JOB_NAME, net="net-1")
        configure(settings).send_task(
            names.ENQUEUE_JOB, kwargs={"payload": job.model_dump()}, queue=names.QUEUE
        )
        deadline = time.monotonic() + KILLED_WAIT_S
        while job_count(settings.database_url) == 0:
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, (
                "the message was never run after the pool processes were killed",
                log.read_text()[-3000:],
            )
            time.sleep(0.3)
        worker.terminate()
        worker.wait(timeout=30)  # a warm shutdown (the stalled pool's waited for the lock too)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def pool_processes(worker_pid: int) -> list[int]:
    """The worker's pool processes: its only children (no embedded beat here)."""
    return [child.pid for child in psutil.Process(worker_pid).children()]


def consumed_long_ago(broker_url: str, broker_db: Path) -> str:
    """A message put on a queue of its own and taken, its row dated a day back: the queue's
    name (kombu keeps the row; a worker's prune deletes it, the queue row stays)."""
    queue = Queue("stale", Exchange("stale"), routing_key="stale")  # type: ignore[no-untyped-call]
    with Connection(broker_url) as conn:  # type: ignore[no-untyped-call]
        conn.Producer().publish(
            "old", exchange=queue.exchange, routing_key="stale", declare=[queue]
        )
        message = queue.bind(conn.default_channel).get(no_ack=False)
        assert message is not None
        message.ack()
    with sqlite3.connect(broker_db) as db:
        db.execute("UPDATE kombu_message SET timestamp = datetime(timestamp, '-1 day')")
    assert queue_counts(broker_db)["stale"] == (1, 0)
    return queue.name


def job_state(database_url: str, job_id: uuid.UUID) -> str:
    with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
        row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id.hex,)).fetchone()
    return str(row[0])


def queue_counts(broker_db: Path) -> dict[str, tuple[int, int]]:
    """Per queue with messages: (messages put there and not pruned yet, messages not yet
    taken by a worker)."""
    if not broker_db.exists():
        return {}
    with sqlite3.connect(broker_db) as conn:
        rows = conn.execute(
            "SELECT q.name, COUNT(m.id), SUM(CASE WHEN m.visible THEN 1 ELSE 0 END)"
            " FROM kombu_queue q JOIN kombu_message m ON m.queue_id = q.id GROUP BY q.name"
        ).fetchall()
    return {name: (int(total), int(visible or 0)) for name, total, visible in rows}


def job_count(database_url: str) -> int:
    with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])

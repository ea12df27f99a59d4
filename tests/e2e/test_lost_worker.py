"""A message whose worker process is lost holding it is sent again, never lost, and never at
full speed for ever: a real worker (`fl-dispatcher worker`, one pool process on flip-api's
queue) on a private Redis and a fresh PostgreSQL database. The enqueue is held on a table
lock the test owns, and its pool process is SIGKILLed there (as the kernel's OOM killer
would), three times: each time Celery's main process sends the message again with its
losses counted, at once the first time and after the retries' backoff from the second
(tasks/base.py `SentAgainRequest`). Once the lock goes, the request is carried out once."""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from celery import Celery
from sqlalchemy import create_engine, func, select, text

from app import migrate, names
from app.schemas import EnqueueJob, job_id_for
from models import Job
from tests.fixtures.burst import JOB_NAME, BurstStack, Layout
from tests.fixtures.db import fresh_pg_database
from tests.fixtures.services import PrivateRedis

pytestmark = pytest.mark.e2e

EXPECTED_S = 40  # seconds on the 2-core CI machine (tests/tools/schedule.py)

WAIT_S = 60.0
KILLS = 3
RETRY_BACKOFF_MAX_S = 8
# One worker, one pool process, flip-api's queue only: beat's loops never take the process.
REQUESTS_ONLY = Layout("requests only", [(names.QUEUE, 1)])


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[BurstStack]:
    redis_server = PrivateRedis(tmp_path / "redis")
    redis_server.start()
    try:
        with fresh_pg_database("fld_lost") as database_url:
            migrate.upgrade(database_url)
            running = BurstStack(
                tmp_path, database_url, redis_server.url(), REQUESTS_ONLY, 60.0, nets=1
            )
            running.env |= {
                "LOG_JSON": "true",
                "RETRY_BACKOFF_MAX_S": str(RETRY_BACKOFF_MAX_S),
            }
            try:
                running.start()
                yield running
            finally:
                running.close()
    finally:
        redis_server.stop()


def test_a_message_whose_worker_is_lost_is_sent_again_with_backoff(stack: BurstStack):
    engine = create_engine(stack.database_url)
    flip_api = Celery("flip-api", broker=stack.broker_url)
    request = EnqueueJob(caller_key="lost-1", definition=JOB_NAME, net="net-1")
    worker = psutil.Process(stack.processes["worker-0"].pid)
    try:
        with engine.connect() as holder:
            holder.begin()
            # Every enqueue reads whether its message was refused before: it waits here.
            holder.execute(text("LOCK TABLE refused_messages IN ACCESS EXCLUSIVE MODE"))
            sent = flip_api.send_task(
                names.ENQUEUE_JOB,
                kwargs={"payload": request.model_dump(mode="json")},
                queue=names.QUEUE,
            )
            killed: list[int] = []
            for _ in range(KILLS):
                held = _wait_for_a_backend_waiting_on_a_lock(engine, exclude=killed)
                child = _pool_process(worker)
                os.kill(child.pid, signal.SIGKILL)
                killed.append(held)
                _wait_until(functools.partial(_gone, child))
            sent_again = _wait_until(lambda: _lines(stack, "sent again", KILLS))
            holder.rollback()
        _wait_until(lambda: _jobs(engine) == 1)
        # Settled: no copy left on the queue nor delivered and unacknowledged (a copy waiting
        # out its countdown in the worker is unacknowledged too), and still one job.
        _wait_until(lambda: _broker_empty(stack.broker_url))
        assert _jobs(engine) == 1
        assert stack.processes["worker-0"].poll() is None
    finally:
        flip_api.close()
        engine.dispose()
    # Each copy counts the losses so far, and waits: at once, then within 2 s * 2^losses.
    assert [line["losses"] for line in sent_again] == [1, 2, 3]
    assert sent_again[0]["retry_in_s"] == 0
    assert all(0 <= line["retry_in_s"] <= min(RETRY_BACKOFF_MAX_S, 2 * 2**n)
               for n, line in enumerate(sent_again))  # fmt: skip
    assert {line["task_id"] for line in sent_again} == {sent.id}  # the same message
    assert all(line["task_name"] == names.ENQUEUE_JOB for line in sent_again)


def _wait_until(found: Any, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"not within {timeout_s:.0f}s")


def _wait_for_a_backend_waiting_on_a_lock(engine: Any, exclude: list[int]) -> int:
    """The pid of the database session that waits on the test's lock (a new one each time:
    the killed process's session ends with it)."""

    def waiting() -> int | None:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalars()
            fresh = [pid for pid in rows if pid not in exclude]
        return fresh[0] if fresh else None

    return int(_wait_until(waiting))


def _pool_process(worker: psutil.Process) -> psutil.Process:
    children = [c for c in worker.children() if c.status() != psutil.STATUS_ZOMBIE]
    assert len(children) == 1, children
    return children[0]


def _lines(stack: BurstStack, message: str, count: int) -> list[dict[str, Any]] | None:
    found = []
    for raw in (stack.workdir / "worker-0.log").read_text().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and message in str(line.get("message", "")):
            found.append(line)
    return found if len(found) >= count else None


def _broker_empty(broker_url: str) -> bool:
    client = redis.Redis.from_url(broker_url)
    try:
        return client.llen(names.QUEUE) == 0 and client.hlen("unacked") == 0
    finally:
        client.close()


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _jobs(engine: Any) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(Job).where(Job.id == job_id_for("lost-1"))
            ).scalar_one()
        )

"""Exactly one beat schedules: two real `fl-dispatcher beat` processes on one PostgreSQL
database and one Redis broker. What each beat sent is read from the broker itself (every
Celery message names its sender's pid in `origin`), and its heartbeat from its data folder
(what compose's health check reads)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app import migrate, names
from app.beat import HEARTBEAT_FILE
from tests.fixtures.db import fresh_pg_database
from tests.fixtures.services import PrivateRedis

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, PrivateRedis]]:
    broker = PrivateRedis(tmp_path / "redis")
    broker.start()
    try:
        with fresh_pg_database("fld_beats") as url:
            migrate.upgrade(url)
            yield url, broker
    finally:
        broker.stop()


def _env(database_url: str, broker_url: str, data_dir: Path) -> dict[str, str]:
    return os.environ | {
        "DATABASE_URL": database_url,
        "BROKER_URL": broker_url,
        "FL_DISPATCHER_DATA_DIR": str(data_dir),
        "HOUSEKEEPING_INTERVAL_S": "1",
        "QUEUED_POLL_S": "0",
        "NETS": "[]",
        "NETS_FILE": "",
        "LOG_LEVEL": "INFO",
    }


def _heartbeat(data_dir: Path) -> dict | None:
    try:
        return json.loads((data_dir / HEARTBEAT_FILE).read_text())
    except (OSError, ValueError):
        return None


def _senders(client: redis.Redis) -> dict[int, int]:
    """Messages waiting on the queues (beat's go to the housekeeping queue), by the pid of
    the process that sent them."""
    counts: dict[int, int] = {}
    raws = [raw for queue in names.QUEUES for raw in client.lrange(queue, 0, -1)]
    for raw in raws:
        origin = json.loads(raw)["headers"]["origin"]  # "gen<pid>@<host>"
        pid = int(origin.removeprefix("gen").split("@")[0])
        counts[pid] = counts.get(pid, 0) + 1
    return counts


def _wait(what: str, condition, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f}s")
        time.sleep(0.2)


def _ready(data_dir: Path, env: dict[str, str], within_s: float) -> int:
    argv = [sys.executable, "-m", "app.entrypoints.cli", "ready"]
    argv += ["--beat-ticked-within", str(within_s)]
    return subprocess.run(argv, env=env, capture_output=True, check=False).returncode


def test_two_beats_one_schedules_and_the_other_takes_over_when_it_dies(stack, tmp_path):
    database_url, broker = stack
    client = redis.Redis(port=broker.port)
    beats: dict[str, subprocess.Popen[bytes]] = {}
    dirs = {name: tmp_path / name for name in ("beat-a", "beat-b")}
    envs = {name: _env(database_url, broker.url(), path) for name, path in dirs.items()}
    try:
        for name in dirs:
            log = (tmp_path / f"{name}.log").open("wb")
            beats[name] = subprocess.Popen(
                [sys.executable, "-m", "app.entrypoints.cli", "beat"],
                env=envs[name],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        _wait(
            "both beats to tick",
            lambda: all(_heartbeat(path) for path in dirs.values()),
        )
        _wait("a few housekeeping ticks", lambda: sum(_senders(client).values()) >= 10)

        active = [n for n, path in dirs.items() if (_heartbeat(path) or {}).get("active")]
        assert len(active) == 1, {n: _heartbeat(p) for n, p in dirs.items()}
        [first] = active
        standby = next(n for n in dirs if n != first)
        assert set(_senders(client)) == {beats[first].pid}
        # Both are alive and ticking, which is what the health check says.
        assert _ready(dirs[first], envs[first], 30) == 0
        assert _ready(dirs[standby], envs[standby], 30) == 0

        beats[first].send_signal(signal.SIGKILL)  # its session ends, and its lock with it
        beats[first].wait(timeout=10)
        _wait(
            "the standby to take over",
            lambda: beats[standby].pid in _senders(client),
            timeout_s=30,
        )

        assert (_heartbeat(dirs[standby]) or {}).get("active") is True
        assert set(_senders(client)) == {beats[first].pid, beats[standby].pid}
        # The dead beat's heartbeat stops: its health check fails once it is stale.
        time.sleep(2.5)  # the staleness itself is what is checked
        assert _ready(dirs[first], envs[first], 2) == 1
    finally:
        for process in beats.values():
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=20)
        client.close()

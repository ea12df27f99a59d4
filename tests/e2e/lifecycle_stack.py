"""The stack of the lifecycle modules (test_lifecycle.py, test_lost_server.py): a real Celery
worker and beat (subprocesses), a private Redis as the broker, PostgreSQL as the job store,
the local driver and a real NVFLARE server with two sites. Each module starts its own, so the
two run side by side on separate test workers (the lost-server case alone takes minutes: the
product's own bound on an unknown submit outcome). Its waits serve other e2e modules too."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import select

from app.local.stack import LocalStack, StackOptions
from models import Job, JobState, NetEvent, NetState
from tests.fixtures.db import fresh_pg_database
from tests.fixtures.services import PrivateRedis

RUN_S = 240  # generous bounds for a 2-core CI machine; the measured numbers are far lower


@contextmanager
def private_broker(folder: Path) -> Iterator[str]:
    """A Redis of the module's own: no message of another run (or another checkout's tests
    running at the same time) can reach this stack's worker."""
    server = PrivateRedis(folder)
    server.start()
    try:
        yield server.url()
    finally:
        server.stop()


def lifecycle_stack_options(workdir: Path, database: str, broker_url: str) -> StackOptions:
    """A 4 s idle grace, housekeeping every 1.5 s, short retry bounds, a separate beat."""
    return StackOptions(
        workdir=workdir,
        database_url=database,
        broker_url=broker_url,
        idle_timeout_s=4,
        ready_timeout_s=90,
        housekeeping_interval_s=1.5,
        embedded_beat=False,  # a separate beat process, as in production
        extra_env={"RETRY_MAX": "2", "RETRY_BACKOFF_MAX_S": "2", "STUCK_AFTER_S": "5"},
    )


@contextmanager
def lifecycle_stack(workdir: Path, database: str, broker_url: str) -> Iterator[LocalStack]:
    """The running stack (`lifecycle_stack_options`)."""
    with LocalStack(lifecycle_stack_options(workdir, database, broker_url)) as running:
        yield running


@contextmanager
def lifecycle_database(name: str) -> Iterator[str]:
    """A fresh PostgreSQL database of the module's own."""
    with fresh_pg_database(name) as url:
        yield url


def wait_state(stack: LocalStack, job_id: uuid.UUID, *states: JobState) -> Job:
    """The job, once it is in one of `states`."""

    def reached() -> Job | None:
        job = stack.job(job_id)
        return job if job is not None and job.state in states else None

    return stack.wait_for(f"job {job_id} in {states}", reached, RUN_S)


def wait_scaled_to_zero(stack: LocalStack) -> None:
    """The net STOPPED and its server process gone."""
    stack.wait_for(
        "the net STOPPED and its server process gone",
        lambda: stack.net().state == NetState.STOPPED and stack.driver().observe().running == 0,
        RUN_S,
    )


def net_moves(stack: LocalStack) -> list[tuple[str, str]]:
    """Every move of the net, oldest first."""
    return stack.read(
        lambda s: [
            (str(e.from_state), str(e.to_state))
            for e in s.scalars(select(NetEvent).order_by(NetEvent.id))
        ]
    )


def cli_json(stack: LocalStack, *argv: str) -> Any:
    """The operator's `fl-dispatcher ... --json`, with the stack's settings; its document."""
    done = subprocess.run(
        [sys.executable, "-m", "app.entrypoints.cli", *argv, "--json"],
        env=stack.env,
        cwd=stack.workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)

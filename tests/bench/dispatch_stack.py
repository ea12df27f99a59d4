"""What the dispatch benchmarks share: a whole local stack on real parts, and the clocks.

A private redis-server on a free loopback port (the broker), a fresh database (the machine's
PostgreSQL, or SQLite with `--sqlite`), a real Celery worker and a separate beat as
subprocesses (`app.local.stack`), the local driver, and a real NVFLARE server with its two
sites from the deployment the harness provisions. Nothing is mocked.

Times come from one wall clock: the benchmark notes `time.time()` just before it sends the
enqueue task, and the worker writes each job move's time (`job_events.at`) from the same
machine's clock. The references are measured here, in the same run, with nvflare's own
admin API only (this process never installs the dispatcher's login patch, which a check
below makes sure of).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, redirect_stdout
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from app import migrate
from app.local.stack import JOB_NAME, LocalStack, StackOptions
from app.settings import Settings
from models import Job, JobEvent, JobState, NetState
from tests.fixtures.db import fresh_pg_database
from tests.fixtures.services import PrivateRedis

# The production default, not the local stack's shorter one: the figures are for defaults.
DEFAULT_READY_POLL_S = str(Settings.model_fields["ready_poll_s"].default)
WAIT_S = 300.0


def stack_args(parser: argparse.ArgumentParser, reps: int) -> argparse.ArgumentParser:
    """The options both dispatch benchmarks take."""
    parser.add_argument("--reps", type=int, default=reps, help="repetitions (median, max)")
    parser.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return parser


@contextmanager
def dispatch_stack(
    args: argparse.Namespace,
    *,
    idle_timeout_s: float,
    housekeeping_interval_s: float,
    before: Callable[[Path, ExitStack], dict[str, Any]] | None = None,
) -> Iterator[LocalStack]:
    """A started local stack on a private Redis and a fresh database; all stopped after.
    `before(stack workdir, exit stack)`, if given, prepares what the stack needs and returns
    StackOptions fields to set (a Flower net: bench_flower_dispatch)."""
    with ExitStack() as stack:
        if args.json:
            # nvflare's session prints "Connecting to FLARE ..." to stdout: keep the JSON clean.
            stack.enter_context(redirect_stdout(sys.stderr))
        workdir = Path(tempfile.mkdtemp(prefix="fld-bench-dispatch-"))
        if not args.keep:
            import shutil

            stack.callback(shutil.rmtree, workdir, True)
        redis = PrivateRedis(workdir / "redis")
        redis.start()
        stack.callback(redis.stop)
        database_url = None
        if not args.sqlite:
            database_url = stack.enter_context(fresh_pg_database("fld_bench_dispatch"))
            migrate.upgrade(database_url)
        more = before(workdir / "stack", stack) if before is not None else {}
        options = StackOptions(
            workdir=workdir / "stack",
            database_url=database_url,
            broker_url=redis.url(),
            idle_timeout_s=idle_timeout_s,
            ready_timeout_s=120,
            housekeeping_interval_s=housekeeping_interval_s,
            embedded_beat=False,  # a separate beat, as in production
            extra_env={"READY_POLL_S": DEFAULT_READY_POLL_S},
            **more,
        )
        local = stack.enter_context(LocalStack(options))
        if args.keep:
            print(f"work folder (logs): {workdir}")
        yield local


def assert_stock_nvflare() -> None:
    """The references must be nvflare's own behaviour: this process has not installed the
    dispatcher's faster login retry (it lives in the worker only)."""
    from nvflare.fuel.hci.client import api

    if getattr(api.Authenticator, "fl_dispatcher_fast_retry", False):
        raise RuntimeError("the benchmark process must use nvflare's stock Authenticator")


def enqueue_at(stack: LocalStack, key: str) -> tuple[uuid.UUID, float]:
    """Enqueue the tiny job as flip-api would; returns (job id, wall-clock send time)."""
    sent = time.time()
    return stack.enqueue(key), sent


def wait_job(stack: LocalStack, job_id: uuid.UUID, *states: JobState, poll_s: float = 0.02) -> Job:
    """The job once it is in one of `states` (a failure or abort ends the benchmark)."""

    def reached() -> Job | None:
        job = stack.job(job_id)
        if job is not None and job.state in (JobState.FAILED, JobState.ABORTED):
            raise RuntimeError(f"job {job_id} is {job.state}: {job.last_error}")
        return job if job is not None and job.state in states else None

    return stack.wait_for(f"job {job_id} in {states}", reached, WAIT_S, poll_s=poll_s)


def moves(stack: LocalStack, job_id: uuid.UUID) -> dict[str, float]:
    """Wall-clock time (epoch s) of each job move, by target state (first occurrence)."""
    rows: list[tuple[JobState, datetime]] = stack.read(
        lambda s: list(
            s.execute(
                select(JobEvent.to_state, JobEvent.at)
                .where(JobEvent.job_id == job_id)
                .order_by(JobEvent.id)
            )
        )
    )
    seen: dict[str, float] = {}
    for state, at in rows:
        seen.setdefault(str(state), at.timestamp())
    return seen


def wait_net(stack: LocalStack, *states: NetState, server_up: bool | None = None) -> None:
    """The net in one of `states` (and its server process up or gone, if asked)."""

    def reached() -> bool:
        if stack.net().state not in states:
            return False
        return server_up is None or (stack.driver().observe().running == 1) == server_up

    stack.wait_for(f"the net in {states}", reached, WAIT_S, poll_s=0.1)


def job_folder(stack: LocalStack) -> Path:
    """The tiny job's folder (what the dispatcher submits, before its per-job edits)."""
    return stack.workdir / "jobs" / JOB_NAME


def stock_session(stack: LocalStack, timeout_s: float = 10.0) -> Any:
    """A logged-in session made with nvflare's own API and defaults."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    assert stack.deployment is not None
    return new_secure_session(
        stack.deployment.admin_user, str(stack.deployment.admin_kit), timeout=timeout_s
    )


def wait_run_finished(session: Any, run_id: str, poll_s: float = 0.2) -> None:
    """Until the server says the run finished (so the sites are free for the next one)."""
    deadline = time.monotonic() + WAIT_S
    while not str(session.get_job_status(run_id) or "").startswith("FINISHED"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"raw run {run_id} did not finish")
        time.sleep(poll_s)


@dataclass
class Series:
    """Samples of one figure, in milliseconds."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded for the table."""
    return round(seconds * 1000, 1)

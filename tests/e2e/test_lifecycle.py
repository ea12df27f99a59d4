"""Whole job lifecycles with a real Celery worker and beat (subprocesses), Redis as the
broker, PostgreSQL as the job store, the local driver and a real NVFLARE server with two
sites. One stack per module: provisioning and site start-up happen once. The server lost
between readiness and submit has a module of its own (test_lost_server.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from app.local.stack import LocalStack
from models import JobState, NetState, ScaleEvent
from tests.e2e.lifecycle_stack import (
    RUN_S,
    lifecycle_database,
    lifecycle_stack,
    net_moves,
    private_broker,
    wait_scaled_to_zero,
    wait_state,
)

pytestmark = [pytest.mark.e2e, pytest.mark.nvflare]

EXPECTED_S = 130  # seconds on the 2-core CI machine (tests/tools/schedule.py)


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    with lifecycle_database("fld_e2e") as url:
        yield url


@pytest.fixture(scope="module")
def broker_url(tmp_path_factory) -> Iterator[str]:
    with private_broker(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_database, broker_url) -> Iterator[LocalStack]:
    with lifecycle_stack(tmp_path_factory.mktemp("e2e"), pg_database, broker_url) as running:
        yield running


def test_cold_start_run_and_scale_to_zero_then_back_again(stack):
    assert stack.net().state == NetState.STOPPED
    assert stack.driver().observe().running == 0

    first = stack.enqueue("e2e-cold-1")
    job = wait_state(stack, first, JobState.COMPLETED, JobState.FAILED)
    assert job.state == JobState.COMPLETED, job.last_error
    assert job.attempts == 0
    wait_scaled_to_zero(stack)

    # Back again: the server comes back and the dispatch logs in on a fresh session.
    second = stack.enqueue("e2e-cold-2")
    job = wait_state(stack, second, JobState.COMPLETED, JobState.FAILED)
    assert job.state == JobState.COMPLETED, job.last_error
    wait_scaled_to_zero(stack)

    moves = net_moves(stack)
    assert moves.count(("STOPPED", "STARTING")) == 2
    assert moves.count(("STOPPING", "STOPPED")) == 2
    outcomes = stack.read(
        lambda s: [
            (e.action, e.outcome) for e in s.scalars(select(ScaleEvent).order_by(ScaleEvent.id))
        ]
    )
    assert outcomes == [("scale_up", "ok"), ("scale_down", "ok")] * 2


def test_back_to_back_jobs_share_one_server_start(stack):
    wait_scaled_to_zero(stack)
    starts_before = net_moves(stack).count(("STOPPED", "STARTING"))
    a = stack.enqueue("e2e-b2b-1")
    b = stack.enqueue("e2e-b2b-2")
    for job_id in (a, b):
        job = wait_state(stack, job_id, JobState.COMPLETED, JobState.FAILED)
        assert job.state == JobState.COMPLETED, job.last_error
    assert net_moves(stack).count(("STOPPED", "STARTING")) == starts_before + 1
    wait_scaled_to_zero(stack)


def wait_run_started(stack: LocalStack, job_id: uuid.UUID) -> None:
    """NVFLARE itself runs the job (its job store says RUNNING), not only the dispatcher: an
    abort sooner would stop a run not yet started, which the dispatcher rightly holds its
    net for while the job runner might still start it (app/usecases/README.md "Guarantees";
    60 s, the case of tests/integration/test_nvflare_admin.py and the unit tier, not of this
    test)."""
    job = stack.job(job_id)
    assert job is not None and job.nvflare_job_id is not None
    stack.wait_for(
        "NVFLARE running the job",
        lambda: any(
            run.get("job_id") == job.nvflare_job_id and run.get("status") == "RUNNING"
            for run in stack.job_store_runs()
        ),
        RUN_S,
        poll_s=0.1,
    )


def test_abort_while_scaling_up_while_running_and_with_the_server_down(stack):
    wait_scaled_to_zero(stack)
    scaling = stack.enqueue("e2e-abort-scaling")
    stack.wait_for("the net STARTING", lambda: stack.net().state == NetState.STARTING, RUN_S)
    stack.client.abort_job(scaling)
    job = wait_state(stack, scaling, JobState.ABORTED)
    assert job.state == JobState.ABORTED

    running = stack.enqueue("e2e-abort-running", required_sites=["site-1", "site-2"])
    wait_state(stack, running, JobState.RUNNING)
    wait_run_started(stack, running)
    stack.client.abort_job(running)
    job = wait_state(stack, running, JobState.ABORTED, JobState.COMPLETED)
    assert job.state == JobState.ABORTED
    stack.wait_for(
        "the net free again",
        lambda: stack.net().state in (NetState.READY, NetState.STOPPED, NetState.STOPPING),
        RUN_S,
    )

    down = stack.enqueue("e2e-abort-down")
    wait_state(stack, down, JobState.RUNNING)
    stack.driver().scale(0)  # the server dies under the job
    stack.client.abort_job(down)
    job = wait_state(stack, down, JobState.ABORTED)
    assert job.state == JobState.ABORTED  # "nothing to abort", no error
    wait_scaled_to_zero(stack)


def test_flower_shows_the_workers_and_tasks_and_requires_auth(stack, broker_url):
    """Celery Flower on the stack's broker, as compose runs it: never open, and it sees our
    worker    and the tasks it runs (workers send task events)."""
    import socket
    import subprocess
    import sys

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    celery_bin = Path(sys.executable).with_name("celery")
    flower = subprocess.Popen(
        [
            str(celery_bin),
            f"--broker={broker_url}",
            "flower",
            "--address=127.0.0.1",
            f"--port={port}",
            "--basic-auth=ops:e2e-secret",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    auth = ("ops", "e2e-secret")
    try:

        def answers() -> bool:
            try:
                return httpx.get(base, timeout=2).status_code == 401
            except httpx.TransportError:
                return False

        stack.wait_for("Celery Flower to listen", answers, 60)
        assert httpx.get(base, auth=("ops", "wrong"), timeout=5).status_code == 401

        def workers() -> dict[str, object]:
            reply = httpx.get(f"{base}/api/workers?refresh=1", auth=auth, timeout=10)
            return {k: v for k, v in reply.json().items() if k.startswith("fl-dispatcher-")}

        assert stack.wait_for("our worker in Celery Flower", workers, 60)

        def tasks() -> set[str]:
            reply = httpx.get(f"{base}/api/tasks", auth=auth, timeout=10).json()
            return {t["name"] for t in reply.values() if t.get("name")}

        seen = stack.wait_for("beat's tasks in Celery Flower", tasks, 60)
        assert any(name.startswith("fl_dispatcher.") for name in seen)
    finally:
        flower.terminate()
        flower.wait(timeout=20)


def test_flag_off_static_view_reports_outage(stack, tmp_path: Path):
    """PER_JOB_FL_SERVER off: the same net is always-on; its server stopped is an OUTAGE,
    and the dispatcher never starts it."""
    wait_scaled_to_zero(stack)
    stack.stop_worker()
    stack.env["PER_JOB_FL_SERVER"] = "false"
    stack.start_worker()
    try:
        stack.wait_for("OUTAGE", lambda: stack.net().state == NetState.OUTAGE, RUN_S)
        assert stack.driver().observe().running == 0  # never scaled
        stack.driver().scale(1)  # an operator brings the always-on server back
        stack.wait_for("READY", lambda: stack.net().state == NetState.READY, RUN_S)
        job_id = stack.enqueue("e2e-static")
        job = wait_state(stack, job_id, JobState.COMPLETED, JobState.FAILED)
        assert job.state == JobState.COMPLETED, job.last_error
        assert stack.driver().observe().running == 1  # still up: always-on is never scaled down
    finally:
        stack.stop_worker()
        stack.driver().scale(0)
        stack.env["PER_JOB_FL_SERVER"] = "true"

"""Drain before a redeploy (issue 40 item 1), end to end: a real Celery worker and beat
(subprocesses), a private Redis, PostgreSQL, the local driver and a real NVFLARE server with
two sites; the operator's side is the real CLI (`drain`, `status`, `job`, `undrain`).

A drained net with a RUNNING job: the job completes, the net scales to zero, a job enqueued
meanwhile stays QUEUED (no attempt spent) and runs after the undrain."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.local.stack import NET, LocalStack
from models import JobState, NetState
from tests.e2e.lifecycle_stack import (
    cli_json,
    lifecycle_database,
    lifecycle_stack,
    net_moves,
    private_broker,
    wait_scaled_to_zero,
    wait_state,
)

pytestmark = [pytest.mark.e2e, pytest.mark.nvflare]

EXPECTED_S = 150  # seconds on the 2-core CI machine (tests/tools/schedule.py)
ROUNDS = 8  # a run long enough to drain its net while it runs
# Housekeeping rounds (1.5 s each) the queued job is watched for while the net is free but
# drained: far more than a free net ever leaves a job waiting.
WATCH_S = 12.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[LocalStack]:
    with (
        lifecycle_database("fld_e2e_drain") as database,
        private_broker(tmp_path_factory.mktemp("redis")) as broker,
        lifecycle_stack(tmp_path_factory.mktemp("drain"), database, broker) as running,
    ):
        yield running


def cli(stack: LocalStack, *argv: str) -> Any:
    """The operator's `fl-dispatcher ... --json`, with the stack's settings; its document."""
    return cli_json(stack, *argv)


def test_a_drained_net_finishes_its_job_scales_to_zero_and_its_queue_runs_after_undrain(stack):
    definition = stack.add_job_definition("drain-fedavg", ROUNDS)
    running = stack.enqueue("e2e-drain-running", definition=definition)
    wait_state(stack, running, JobState.RUNNING)

    drained = cli(stack, "drain", NET, "--reason", "e2e redeploy")
    assert drained["state"] == "draining", drained
    assert drained["nets"][0]["active_job"]["id"] == str(running)
    waiting = stack.enqueue("e2e-drain-waiting")

    job = wait_state(stack, running, JobState.COMPLETED, JobState.FAILED)
    assert job.state == JobState.COMPLETED, job.last_error
    wait_scaled_to_zero(stack)  # the idle grace (4 s) passed with a job queued for the net
    deadline = time.monotonic() + WATCH_S
    while time.monotonic() < deadline:  # no claim, no scale-up, while the job waits
        job = stack.job(waiting)
        assert job is not None
        assert (job.state, job.attempts, job.retries) == (JobState.QUEUED, 0, 0)
        assert stack.net().state == NetState.STOPPED
        time.sleep(0.5)
    status = cli(stack, "status", "--no-probe")
    assert status["drain"]["state"] == "drained" and status["drain"]["queued"] == 1
    assert [n["drained"] for n in status["nets"]] == [True]
    assert cli(stack, "job", str(waiting))["waiting_for"].startswith("net drained: net local-net")
    starts = net_moves(stack).count(("STOPPED", "STARTING"))

    undrained = cli(stack, "undrain", NET)
    assert undrained["state"] == "none" and undrained["notified"] is True
    job = wait_state(stack, waiting, JobState.COMPLETED, JobState.FAILED)
    assert job.state == JobState.COMPLETED, job.last_error
    assert job.attempts == 0
    assert net_moves(stack).count(("STOPPED", "STARTING")) == starts + 1
    wait_scaled_to_zero(stack)

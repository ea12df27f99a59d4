"""A Flower net through the whole chain (issue 38): a real Celery worker and beat
(subprocesses), a private Redis as the broker, PostgreSQL as the job store, the local driver
starting a real SuperLink (flwr 1.42 from its own virtualenv, tests/fixtures/flower.py) with
TLS and SuperNode authentication, and two real SuperNodes started by the test. The job's
bundle is a Flower App folder (app/local/flower_app, the demo's too). The same deployment has an
NVFLARE net (LocalStack's, a real server and two sites): the two serve jobs side by side."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import select

from app.adapters.backend import RunState
from app.adapters.drivers import build_driver
from app.adapters.flower.client import build_flower_client
from app.local.flower import build_flower_app
from app.local.stack import NET as NVFLARE_NET
from app.local.stack import LocalStack, StackOptions
from app.process_control import terminate_tree
from app.settings import Settings
from models import JobState, NetEvent, NetState
from tests.e2e.lifecycle_stack import RUN_S, lifecycle_database, private_broker
from tests.fixtures.flower import NODES_TIMEOUT_S, SITES, START_TIMEOUT_S, FlowerSystem, poll

pytestmark = [pytest.mark.e2e, pytest.mark.flower]

EXPECTED_S = 240  # seconds on the 2-core CI machine (tests/tools/schedule.py): 232 s measured

NET = "flower-net"
APP_NAME = "flower-app"
LONG_APP = "flower-app-long"
MID_APP = "flower-app-mid"  # 4 rounds: a round took 3-10 s here, a ServerApp's start ~40 s


def flower_net(system: FlowerSystem, workdir: Path) -> dict[str, Any]:
    """The stack's Flower net: the system's port, TLS files and SuperNode names."""
    return {
        "name": NET,
        "backend": "flower",
        "idle_timeout_s": 4,
        "ready_timeout_s": 120,
        "required_sites": list(SITES),
        "driver": {
            "kind": "local",
            "superlink_dir": str(workdir / "superlink"),
            "ssl_certfile": str(system.tls.cert),
            "ssl_keyfile": str(system.tls.key),
        },
        "flower": {"address": system.address, "root_certificates": str(system.tls.ca)},
    }


def register_sites(system: FlowerSystem, workdir: Path, venv: Path) -> None:
    """What an operator does once: the SuperLink up (by the net's own driver, on its own
    state database), each SuperNode registered by its site name and started, then the
    SuperLink down again. The SuperNodes keep running and reconnect when it is back."""
    settings = Settings(
        NETS=json.dumps([flower_net(system, workdir)]),
        FLWR_VENV=str(venv),
        FL_DISPATCHER_DATA_DIR=str(workdir / "data"),  # the stack's: one driver state file
    )
    driver = build_driver(settings.net(NET), settings)
    driver.scale(1)
    poll("the SuperLink's port", lambda: driver.observe().running == 1, START_TIMEOUT_S)
    system.register_nodes()
    for site in SITES:
        system.start_supernode(site)

    def ready() -> bool:
        with build_flower_client(settings.net(NET), settings) as client:
            return client.is_ready(SITES).ready

    poll("both SuperNodes online", ready, NODES_TIMEOUT_S)
    driver.scale(0)


@pytest.fixture(scope="module")
def stack(flower_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("flower-e2e").resolve()
    system = FlowerSystem(flower_venv, workdir / "flower", database=False)
    try:
        register_sites(system, workdir, flower_venv)
        build_flower_app(workdir / "jobs" / APP_NAME)
        build_flower_app(workdir / "jobs" / LONG_APP, **{"num-rounds": 1000, "round-sleep-s": 0.5})
        build_flower_app(workdir / "jobs" / MID_APP, **{"num-rounds": 4})
        with (
            lifecycle_database("fld_e2e_flower") as database,
            private_broker(workdir / "redis") as broker,
        ):
            options = StackOptions(
                workdir=workdir,
                database_url=database,
                broker_url=broker,
                idle_timeout_s=4,
                ready_timeout_s=120,
                housekeeping_interval_s=1.5,
                embedded_beat=False,  # a separate beat process, as in production
                nvflare=True,  # its `local-net` beside the Flower net
                extra_nets=[flower_net(system, workdir)],
                flwr_venv=flower_venv,
                extra_env={"RETRY_MAX": "2", "RETRY_BACKOFF_MAX_S": "2", "STUCK_AFTER_S": "5"},
            )
            with LocalStack(options) as running:
                yield running
    finally:
        system.close()


def wait_state(stack: LocalStack, job_id: Any, *states: JobState) -> Any:
    """The job, once it is in one of `states`."""

    def reached() -> Any:
        job = stack.job(job_id)
        return job if job is not None and job.state in states else None

    return stack.wait_for(f"job {job_id} in {states}", reached, RUN_S)


def wait_scaled_to_zero(stack: LocalStack) -> None:
    """The net STOPPED and its SuperLink gone."""
    stack.wait_for(
        "the net STOPPED and its SuperLink gone",
        lambda: (
            stack.net(NET).state == NetState.STOPPED and stack.driver(NET).observe().running == 0
        ),
        RUN_S,
    )


def net_moves(stack: LocalStack) -> list[tuple[str, str]]:
    return stack.read(
        lambda s: [
            (str(e.from_state), str(e.to_state))
            for e in s.scalars(
                select(NetEvent).where(NetEvent.net_name == NET).order_by(NetEvent.id)
            )
        ]
    )


def test_a_job_on_a_flower_net_completes_and_the_net_scales_to_zero(stack):
    assert stack.net(NET).state == NetState.STOPPED
    assert stack.driver(NET).observe().running == 0

    job_id = stack.enqueue("flower-e2e-1", definition=APP_NAME, net=NET)
    job = wait_state(stack, job_id, JobState.COMPLETED, JobState.FAILED)
    assert job.state == JobState.COMPLETED, job.last_error
    assert job.attempts == 0 and job.nvflare_job_id is not None  # the Flower run's id
    wait_scaled_to_zero(stack)
    moves = net_moves(stack)
    assert moves.count(("STOPPED", "STARTING")) == 1
    assert moves[-1] == ("STOPPING", "STOPPED")


def test_abort_with_the_superlink_down_ends_aborted_with_no_error(stack):
    wait_scaled_to_zero(stack)
    job_id = stack.enqueue("flower-e2e-abort-down", definition=LONG_APP, net=NET)
    job = wait_state(stack, job_id, JobState.RUNNING)
    stack.driver(NET).scale(0)  # the SuperLink dies under the run
    stack.client.abort_job(job_id)
    job = wait_state(stack, job_id, JobState.ABORTED)
    assert job.state == JobState.ABORTED  # "nothing to abort", no error
    assert job.last_error is None
    wait_scaled_to_zero(stack)


def test_a_flower_net_and_an_nvflare_net_serve_jobs_side_by_side(stack):
    wait_scaled_to_zero(stack)
    flower = stack.enqueue("flower-e2e-beside", definition=APP_NAME, net=NET)
    nvflare = stack.enqueue("nvflare-e2e-beside", net=NVFLARE_NET)
    for job_id in (flower, nvflare):
        job = wait_state(stack, job_id, JobState.COMPLETED, JobState.FAILED)
        assert job.state == JobState.COMPLETED, job.last_error
    assert (stack.job(flower).net_name, stack.job(nvflare).net_name) == (NET, NVFLARE_NET)
    wait_scaled_to_zero(stack)
    stack.wait_for(
        "the NVFLARE net STOPPED and its server gone",
        lambda: (
            stack.net(NVFLARE_NET).state == NetState.STOPPED
            and stack.driver(NVFLARE_NET).observe().running == 0
        ),
        RUN_S,
    )


def server_apps(stack: LocalStack) -> list[int]:
    """The ServerApp processes running now under the net's SuperLink (its FLWR_HOME)."""
    home = str(stack.workdir / "superlink") + os.sep
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("FLWR_HOME", "").startswith(home) and any(
                "flwr-serverapp" in part for part in process.cmdline()
            ):
                found.append(process.pid)
    return found


def test_a_superlink_killed_mid_run_is_detected_and_the_job_requeued_with_one_live_run(stack):
    wait_scaled_to_zero(stack)
    job_id = stack.enqueue("flower-e2e-killed", definition=MID_APP, net=NET)
    job = wait_state(stack, job_id, JobState.RUNNING)
    first_run = job.nvflare_job_id
    assert stack.settings is not None
    with build_flower_client(stack.settings.net(NET), stack.settings) as client:
        poll(
            "the ServerApp running",
            lambda: client.job_status(first_run).started_at is not None,
            RUN_S,
            0.2,
        )
    server = stack.driver(NET).server_process()
    assert server is not None
    terminate_tree(server[0], sig=signal.SIGKILL, expected_ticks=server[1])  # a crash

    seen: list[int] = []

    def settled() -> Any:
        seen.append(len(server_apps(stack)))
        job = stack.job(job_id)
        done = job is not None and job.state in (JobState.COMPLETED, JobState.FAILED)
        return job if done else None

    job = stack.wait_for("the requeued job settled", settled, RUN_S, poll_s=0.5)
    assert job.state == JobState.COMPLETED, job.last_error
    assert job.attempts == 1 and job.nvflare_job_id != first_run  # requeued, run anew
    assert max(seen) == 1  # the new run's ServerApp, never beside another
    with build_flower_client(stack.settings.net(NET), stack.settings) as client:
        # Its record: finished:failed, no heartbeat from its ServerApp (no verdict), or
        # finished:stopped when the next attempt's readiness found it still reading running
        # before its heartbeat expired (app.usecases.revived_runs stops every live run).
        assert client.job_status(first_run).state in (RunState.LOST, RunState.ABORTED)
    wait_scaled_to_zero(stack)

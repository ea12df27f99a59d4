"""The local scale driver against a real NVFLARE server process.

The driver's net has its own provisioned kit and port, so these tests never touch the
session's shared server. Worker restarts and concurrent workers are real separate Python
processes; "foreign" processes are real processes the driver did not start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import process_control
from app.adapters.backend import ServerState
from app.adapters.drivers.base import Observation
from app.adapters.drivers.local import LocalDriver
from app.adapters.nvflare.client import build_admin_client
from app.errors import DriverMisconfigured
from app.local import nvflare as nvflare_local
from app.local.nvflare import Deployment
from tests.fixtures.nvflare import admin_settings, kit_processes, net_config, poll

pytestmark = [pytest.mark.integration, pytest.mark.nvflare]

NET = "local-net"
UP_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def driver_deployment(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    """A server kit of its own (no sites needed): a free port nobody else uses."""
    return nvflare_local.provision(tmp_path_factory.mktemp("driver-net"), project="driver-net")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "local-driver"


@pytest.fixture
def driver(driver_deployment: Deployment, state_dir: Path) -> Iterator[LocalDriver]:
    driver = LocalDriver(NET, driver_deployment.server_kit, state_dir)
    try:
        yield driver
    finally:
        driver.scale(0)
        assert not server_pids(driver_deployment), "a server outlived the test"


def server_pids(deployment: Deployment) -> list[int]:
    """Live NVFLARE processes (server or its job processes) running this deployment's kit."""
    return kit_processes(deployment.server_kit)


def wait_up(driver: LocalDriver) -> None:
    poll("the local server's port", lambda: driver.observe().is_up, UP_TIMEOUT_S, 0.05)


def recorded_pid(state_dir: Path) -> int | None:
    pid = json.loads((state_dir / f"{NET}.json").read_text())["pid"]
    return int(pid) if pid is not None else None


def run_driver_in_subprocess(
    deployment: Deployment,
    state_dir: Path,
    body: str,
    *,
    wait: bool = True,
    args: list[str] | None = None,
) -> subprocess.Popen[bytes]:
    """A separate Python process using the driver, as a worker would."""
    kit, state = str(deployment.server_kit), str(state_dir)
    code = (
        "from pathlib import Path\n"
        "from app.adapters.drivers.local import LocalDriver\n"
        f"driver = LocalDriver({NET!r}, Path({kit!r}), Path({state!r}))\n"
    ) + textwrap.dedent(body)
    process = subprocess.Popen(
        [sys.executable, "-c", code, *(args or [])], cwd=Path(__file__).parents[2]
    )
    if wait:
        assert process.wait(timeout=60) == 0
    return process


def test_scale_up_down_up_against_a_real_server(
    driver: LocalDriver, driver_deployment: Deployment
) -> None:
    assert driver.observe() == Observation(desired=0, running=0, pending=0)

    driver.scale(1)
    first = driver.observe()
    assert first.desired == 1 and first.running + first.pending == 1
    wait_up(driver)
    # A real NVFLARE server: an admin login works against it.
    admin = build_admin_client(net_config(driver_deployment), admin_settings())
    try:
        poll(
            "a login",
            lambda: admin.server_state() is ServerState.STARTED,
            UP_TIMEOUT_S,
            0.2,
        )
    finally:
        admin.close()

    driver.scale(0)
    assert driver.observe() == Observation(desired=0, running=0, pending=0)
    assert not server_pids(driver_deployment)
    assert not process_control.port_open(driver_deployment.host, driver_deployment.port)

    driver.scale(1)
    wait_up(driver)
    assert len(server_pids(driver_deployment)) == 1


def test_scale_up_twice_is_one_process_and_scale_down_twice_is_harmless(
    driver: LocalDriver, driver_deployment: Deployment, state_dir: Path
) -> None:
    driver.scale(1)
    pid = recorded_pid(state_dir)
    driver.scale(1)
    wait_up(driver)
    driver.scale(1)

    assert recorded_pid(state_dir) == pid
    assert server_pids(driver_deployment) == [pid]

    driver.scale(0)
    driver.scale(0)
    assert driver.observe().desired == 0
    assert not server_pids(driver_deployment)


def test_a_second_driver_instance_and_a_restarted_worker_see_the_same_server(
    driver: LocalDriver, driver_deployment: Deployment, state_dir: Path
) -> None:
    # A worker process starts the server and exits; the server lives on.
    run_driver_in_subprocess(driver_deployment, state_dir, "driver.scale(1)")
    pid = recorded_pid(state_dir)
    wait_up(driver)

    other = LocalDriver(NET, driver_deployment.server_kit, state_dir)
    assert other.observe().running == 1
    other.scale(1)  # a restarted worker asking again starts nothing
    assert server_pids(driver_deployment) == [pid]

    other.scale(0)  # and it can stop a server it did not start in this process
    assert driver.observe().running == 0
    assert not server_pids(driver_deployment)


def test_concurrent_scale_up_from_two_processes_starts_one_server(
    driver: LocalDriver, driver_deployment: Deployment, state_dir: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    body = f"""
        import sys, time
        Path({str(tmp_path)!r}, "ready-" + sys.argv[1]).touch()
        while not Path({str(go)!r}).exists():
            time.sleep(0.001)
        driver.scale(1)
    """
    workers = [
        run_driver_in_subprocess(driver_deployment, state_dir, body, wait=False, args=[str(n)])
        for n in range(2)
    ]
    poll("both workers", lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, 0.01)
    go.touch()  # release both at the same moment
    assert [w.wait(timeout=60) for w in workers] == [0, 0]

    wait_up(driver)
    assert server_pids(driver_deployment) == [recorded_pid(state_dir)]


def test_stale_pid_file_of_a_dead_process_is_replaced_by_a_new_server(
    driver: LocalDriver, driver_deployment: Deployment, state_dir: Path
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    state_dir.mkdir(parents=True)
    (state_dir / f"{NET}.json").write_text(
        json.dumps({"desired": 1, "pid": dead.pid, "start_ticks": 1, "kit": "x", "port": 1})
    )

    stale = driver.observe()
    assert (stale.desired, stale.running, stale.pending) == (1, 0, 0)
    assert stale.failure and str(dead.pid) in stale.failure

    driver.scale(1)
    wait_up(driver)
    assert recorded_pid(state_dir) != dead.pid
    assert driver.observe().failure is None


@pytest.mark.parametrize("same_start_time", [True, False], ids=["pid-and-time", "pid-only"])
def test_never_signals_a_process_it_did_not_start(
    driver: LocalDriver, driver_deployment: Deployment, state_dir: Path, same_start_time: bool
) -> None:
    """A PID file pointing at someone else's process (pid reuse, a hand-edited file)."""
    foreign = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        ticks = process_control.proc_start_ticks(foreign.pid)
        assert ticks is not None
        state_dir.mkdir(parents=True)
        (state_dir / f"{NET}.json").write_text(
            json.dumps(
                {
                    "desired": 1,
                    "pid": foreign.pid,
                    "start_ticks": ticks if same_start_time else ticks + 1,
                    "kit": str(driver_deployment.server_kit),
                    "port": driver_deployment.port,
                }
            )
        )

        assert driver.observe().running == 0
        driver.scale(0)
        assert foreign.poll() is None
        driver.scale(1)  # the foreign process is not our server: start the real one
        wait_up(driver)
        driver.scale(0)
        assert foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait()


def test_a_port_served_by_a_process_it_did_not_start_is_refused_and_left_alone(
    driver: LocalDriver, driver_deployment: Deployment
) -> None:
    outsider = nvflare_local.start_server(driver_deployment)
    try:
        process_control.wait_port(driver_deployment.host, driver_deployment.port, UP_TIMEOUT_S)
        with pytest.raises(DriverMisconfigured, match="did not start"):
            driver.scale(1)
        driver.scale(0)
        assert outsider.alive()
        assert server_pids(driver_deployment) == [outsider.pid]
    finally:
        nvflare_local.stop(outsider)


def test_a_reconfigured_net_replaces_the_server_of_its_previous_kit(
    driver: LocalDriver,
    driver_deployment: Deployment,
    state_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    driver.scale(1)
    wait_up(driver)
    new_kit = nvflare_local.provision(tmp_path_factory.mktemp("new-kit"), project="driver-net-2")
    reconfigured = LocalDriver(NET, new_kit.server_kit, state_dir)
    try:
        reconfigured.scale(1)
        wait_up(reconfigured)
        assert not server_pids(driver_deployment)  # the old kit's server is gone
        assert server_pids(new_kit) == [recorded_pid(state_dir)]
    finally:
        reconfigured.scale(0)
    assert not server_pids(new_kit)


def test_a_server_orphaned_by_a_scaler_killed_before_recording_it_is_adopted(
    driver: LocalDriver, driver_deployment: Deployment, state_dir: Path
) -> None:
    """A worker asked for the replica, launched the server and was killed (SIGKILL, OOM)
    before it recorded the server's pid: the server runs on, unrecorded. The next scale-up
    (the step's redelivery) found its port held by "a process this driver did not start"
    and marked the net MISCONFIGURED. The server is this net's own, launched after the
    recorded intent: adopted (one server, recorded), and stopped by a scale-down."""
    orphans = _orphan_a_server(driver_deployment, state_dir)
    driver.scale(1)  # was a second server beside it (or, once it listened, MISCONFIGURED)
    wait_up(driver)
    assert server_pids(driver_deployment) == orphans == [recorded_pid(state_dir)]


def test_a_server_orphaned_by_a_killed_scaler_reads_up_and_a_scale_down_stops_it(
    driver: LocalDriver, driver_deployment: Deployment, state_dir: Path
) -> None:
    """The same orphan, met by a look (observe: was "no local server process recorded", a
    failure that gives the start up) and a scale-down (was: nothing recorded to stop, the
    server left running)."""
    _orphan_a_server(driver_deployment, state_dir)
    wait_up(driver)
    assert driver.observe().failure is None
    driver.scale(0)
    assert not server_pids(driver_deployment)


def _orphan_a_server(deployment: Deployment, state_dir: Path) -> list[int]:
    """A worker's scale-up killed between the server's launch and the record of its pid."""
    killed = run_driver_in_subprocess(
        deployment,
        state_dir,
        """
        import os
        launch = driver._launch
        def launch_then_die(env):
            handle = launch(env)
            os._exit(9)  # killed between the launch and the record of its pid
        driver._launch = launch_then_die
        driver.scale(1)
        """,
        wait=False,
    )
    assert killed.wait(timeout=60) == 9
    orphans: list[int] = poll("the orphaned server", lambda: server_pids(deployment), 30, 0.05)
    assert recorded_pid(state_dir) is None
    return orphans

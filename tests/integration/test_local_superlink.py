"""The local driver of a Flower net against a real SuperLink (flwr 1.42 from its own
virtualenv, tests/fixtures/flower.py) and two real SuperNodes: it starts the SuperLink as it
starts an fl-server, one process for two drivers, stops it with what it started, and the
SuperNodes registered once are ready again after a scale to zero (its state database)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from app import process_control
from app.adapters.backend import ServerState
from app.adapters.drivers import build_driver
from app.adapters.drivers.local_superlink import SuperLinkDriver
from app.adapters.flower.client import build_flower_client
from app.settings import Settings
from tests.fixtures.flower import NODES_TIMEOUT_S, SITES, START_TIMEOUT_S, FlowerSystem, poll

pytestmark = [pytest.mark.integration, pytest.mark.flower]

EXPECTED_S = 30  # seconds on the 2-core CI machine (tests/tools/schedule.py): 23 s measured
NET = "flower-local"


def flower_net(system: FlowerSystem) -> dict[str, object]:
    """A local Flower net on the system's port, TLS files and SuperNode names."""
    return {
        "name": NET,
        "backend": "flower",
        "required_sites": list(SITES),
        "driver": {
            "kind": "local",
            "superlink_dir": str(system.workspace / "driver-superlink"),
            "ssl_certfile": str(system.tls.cert),
            "ssl_keyfile": str(system.tls.key),
        },
        "flower": {"address": system.address, "root_certificates": str(system.tls.ca)},
    }


@pytest.fixture
def system(flower_venv: Path, tmp_path: Path) -> Iterator[FlowerSystem]:
    """SuperNodes and TLS of a Flower system whose SuperLink only the driver starts."""
    made = FlowerSystem(flower_venv, tmp_path / "flower", database=False)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def settings(system: FlowerSystem, flower_venv: Path, tmp_path: Path) -> Settings:
    return Settings(
        NETS=json.dumps([flower_net(system)]),
        FLWR_VENV=str(flower_venv),
        FL_DISPATCHER_DATA_DIR=str(tmp_path / "data"),
    )


def superlink_processes(folder: Path) -> list[int]:
    """Processes run from the SuperLink's folder (it, its SuperExec, its ServerApps)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("FLWR_HOME", "").startswith(str(folder) + os.sep):
                found.append(process.pid)
    return found


def ready(settings: Settings) -> bool:
    with build_flower_client(settings.net(NET), settings) as client:
        return client.is_ready(SITES).ready


def test_the_driver_starts_one_superlink_stops_it_whole_and_sites_stay_registered(
    system: FlowerSystem, settings: Settings
) -> None:
    net = settings.net(NET)
    driver = build_driver(net, settings)
    assert isinstance(driver, SuperLinkDriver)
    assert driver.observe().running == 0

    driver.scale(1)
    poll("the SuperLink's port", lambda: driver.observe().running == 1, START_TIMEOUT_S)
    with build_flower_client(net, settings) as client:
        assert client.server_state() is ServerState.STARTED
    # Another process's driver (a second worker) finds the same SuperLink: no second one.
    server = driver.server_process()
    assert server is not None
    build_driver(net, settings).scale(1)
    assert build_driver(net, settings).server_process() == server

    system.register_nodes()
    for site in SITES:
        system.start_supernode(site)
    poll("both SuperNodes online", lambda: ready(settings), NODES_TIMEOUT_S)

    folder = system.workspace / "driver-superlink"
    assert superlink_processes(folder)
    driver.scale(0)
    assert driver.observe().running == 0 and driver.server_process() is None
    assert not process_control.port_open("127.0.0.1", system.port)
    assert superlink_processes(folder) == []
    with build_flower_client(net, settings) as client:
        assert client.server_state() is ServerState.UNREACHABLE

    # Back up: the SuperNodes registered once are known again (its state database), and
    # reconnect by themselves.
    driver.scale(1)
    poll("both SuperNodes online again", lambda: ready(settings), NODES_TIMEOUT_S)
    assert (folder / "state.db").is_file()
    driver.scale(0)
    assert superlink_processes(folder) == []

"""A killed test run does not leave its world behind (tests/fixtures/testrun.py): two real
pytest runs start what the suite's fixtures start (a podman container, a private Redis, a
server in a session of its own, a database on the machine's PostgreSQL, what a compose
project makes); one is SIGKILLed, as a time limit does. The next run's sweep removes all
the dead run left and nothing of the live one; the live one, sent SIGTERM, removes its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from app.process_control import proc_start_ticks
from tests.fixtures import testrun
from tests.fixtures.containers import podman
from tests.fixtures.db import PG_ADMIN_URL

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]

# The run's only test: it starts its world, says so, and waits to be killed.
WORLD = """
import json, os, subprocess, time
from pathlib import Path

from app.process_control import proc_start_ticks
from tests.fixtures import testrun
from tests.fixtures.containers import SERVES_UNTIL_STOPPED, podman
from tests.fixtures.db import fresh_pg_database
from tests.fixtures.services import PrivateRedis


def test_holds_its_world(containers, tmp_path):
    container = containers.create("held", SERVES_UNTIL_STOPPED)
    podman("start", container)
    redis = PrivateRedis(tmp_path / "redis")
    redis.start()
    # As NVFLARE's servers and sites, the e2e tiers' workers: a session of its own.
    server = subprocess.Popen(["sleep", "600"], start_new_session=True)
    # What podman-compose makes for a project: all labelled with it, but the pod.
    project = f"fltestrun{os.getpid()}"
    testrun.record("compose", project)
    label = ["--label", f"io.podman.compose.project={project}"]
    podman("network", "create", *label, f"{project}_default")
    podman("volume", "create", *label, f"{project}_data")
    podman("pod", "create", "--infra=false", f"pod_{project}")
    with fresh_pg_database("fld_killed") as url:
        world = {
            "run": os.environ[testrun.ENV],
            "processes": [
                [p.pid, proc_start_ticks(p.pid)] for p in (redis.process, server)
            ],
            "container": container,
            "network": f"{project}_default",
            "volume": f"{project}_data",
            "pod": f"pod_{project}",
            "database": url.rsplit("/", 1)[1],
        }
        ready = Path(__file__).with_name("world.json")
        ready.with_suffix(".tmp").write_text(json.dumps(world))
        ready.with_suffix(".tmp").rename(ready)
        time.sleep(600)
"""


@dataclass
class World:
    """What one run started, and which of it is there."""

    facts: dict[str, Any]

    @property
    def run(self) -> testrun.RunId:
        run = testrun.RunId.parse(self.facts["run"])
        assert run is not None
        return run

    def present(self) -> dict[str, bool]:
        there = {
            f"process {pid}": proc_start_ticks(pid) == ticks
            for pid, ticks in self.facts["processes"]
        }
        for kind in ("container", "network", "volume", "pod"):
            name = self.facts[kind]
            there[f"{kind} {name}"] = podman(kind, "exists", name, check=False).returncode == 0
        engine = create_engine(PG_ADMIN_URL)
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"),
                {"name": self.facts["database"]},
            ).first()
        engine.dispose()
        there[f"database {self.facts['database']}"] = found is not None
        there["the run's folder"] = self.run.folder.is_dir()
        return there


class Runs:
    """pytest runs of the WORLD test, each a run of its own (no id inherited from this one)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        folder = self.folder / name
        folder.mkdir()
        (folder / "test_world.py").write_text(WORLD)
        (folder / "conftest.py").write_text(
            'pytest_plugins = ["tests.fixtures.testrun", "tests.fixtures.containers"]\n'
        )
        (folder / "pytest.ini").write_text("[pytest]\n")
        env = {key: value for key, value in os.environ.items() if key != testrun.ENV}
        env["PYTHONPATH"] = str(ROOT)
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "-c", str(folder / "pytest.ini"), "--rootdir", str(folder),
                "--basetemp", str(folder / "tmp"), str(folder / "test_world.py")]  # fmt: skip
        with (folder / "pytest.log").open("wb") as log:
            self.processes[name] = subprocess.Popen(
                argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def world(self, name: str, timeout_s: float = 120) -> World:
        """The run's world, once it has started all of it."""
        ready = self.folder / name / "world.json"
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            log = (self.folder / name / "pytest.log").read_text()
            assert self.processes[name].poll() is None, f"run {name} ended:\n{log}"
            assert time.monotonic() < deadline, f"run {name}: no world in {timeout_s}s\n{log}"
            time.sleep(0.1)
        return World(json.loads(ready.read_text()))

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def sweep() -> subprocess.CompletedProcess[str]:
    """What tests/run.sh runs before the tests: the next run's sweep."""
    return subprocess.run(
        [sys.executable, "-m", "tests.fixtures.testrun"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def runs(tmp_path: Path, busybox_image: str) -> Iterator[Runs]:
    started = Runs(tmp_path)
    try:
        yield started
    finally:
        started.close()
        sweep()  # whatever a failed test's runs left


def test_the_next_run_clears_what_a_killed_run_left_and_nothing_of_a_live_one(runs: Runs):
    runs.start("killed")
    runs.start("live")
    killed, live = runs.world("killed"), runs.world("live")
    everything = dict.fromkeys(killed.present(), True)
    nothing = dict.fromkeys(killed.present(), False)

    runs.processes["killed"].send_signal(signal.SIGKILL)  # a time limit: no teardown at all
    runs.processes["killed"].wait(timeout=30)

    assert killed.present() == everything  # what a killed run leaves behind
    swept = sweep()
    assert swept.returncode == 0, swept.stderr
    assert killed.present() == nothing, swept.stderr
    assert f"dead run left, {killed.run}:" in swept.stderr
    assert live.present() == dict.fromkeys(live.present(), True)
    assert str(live.run) not in swept.stderr


def test_a_run_sent_sigterm_clears_what_it_started(runs: Runs):
    runs.start("stopped")
    stopped = runs.world("stopped")

    runs.processes["stopped"].send_signal(signal.SIGTERM)

    assert runs.processes["stopped"].wait(timeout=60) == 128 + signal.SIGTERM
    assert stopped.present() == dict.fromkeys(stopped.present(), False)

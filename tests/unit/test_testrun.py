"""tests/fixtures/testrun.py: which processes and folders belong to which test run, and that
a sweep clears a dead run's and keeps a live run's (real processes, no container engine or
database; the containers tier kills real pytest runs: tests/containers/test_killed_run.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.procs import proc_start_ticks
from tests.fixtures import testrun
from tests.fixtures.testrun import RunId


@pytest.fixture(autouse=True)
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run folders of this test only: the machine's are other runs'."""
    root = tmp_path / "runs"
    monkeypatch.setattr(testrun, "runs_root", lambda: root)
    return root


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def dead_run() -> RunId:
    """A run whose main process is gone: its pid is this process's, its start time not."""
    alive = RunId.of_this_process()
    return RunId(alive.boot, alive.pid, alive.ticks + 1)


def start(spawned: list[subprocess.Popen[bytes]], run: RunId, *argv: str) -> int:
    """A process of `run` in a session of its own, as the tests' servers are; its pid."""
    env = os.environ | {testrun.ENV: str(run)}
    process = subprocess.Popen(argv or ("sleep", "60"), env=env, start_new_session=True)
    spawned.append(process)
    return process.pid


def running(pid: int) -> bool:
    return proc_start_ticks(pid) is not None


def recorded_folder(monkeypatch: pytest.MonkeyPatch, run: RunId, folder: Path) -> Path:
    """A folder `run` made and recorded, as PrivatePostgres does its cluster's."""
    folder.mkdir()
    with monkeypatch.context() as env:
        env.setenv(testrun.ENV, str(run))
        testrun.record("path", str(folder))
    return folder


def test_a_run_is_alive_while_its_main_process_is_the_one_that_started_it():
    run = RunId.of_this_process()

    assert run.alive()
    assert RunId.parse(str(run)) == run
    assert not dead_run().alive()  # the pid is reused by another process
    assert not RunId("another0boot", run.pid, run.ticks).alive()
    assert RunId.parse("not-a-run") is None


def test_a_sweep_clears_a_dead_runs_processes_and_folders_and_keeps_a_live_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawned: list[subprocess.Popen[bytes]]
):
    dead, live = dead_run(), RunId.of_this_process()
    dead_pid, live_pid = start(spawned, dead), start(spawned, live)
    dead_folder = recorded_folder(monkeypatch, dead, tmp_path / "dead-scratch")
    live_folder = recorded_folder(monkeypatch, live, tmp_path / "live-scratch")

    cleared = testrun.sweep()

    found = [result.run for result in cleared if result.found]
    assert str(dead) in found and str(live) not in found
    assert not running(dead_pid) and not dead_folder.exists() and not dead.folder.exists()
    assert running(live_pid) and live_folder.is_dir() and live.folder.is_dir()


def test_podmans_helpers_are_never_stopped(tmp_path: Path, spawned: list[subprocess.Popen[bytes]]):
    # aardvark-dns, started under a run by the podman command that first needed it, serves
    # every container network on the machine, other runs' and the user's.
    helper = tmp_path / "aardvark-dns"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", helper)
    dead = dead_run()
    helper_pid, plain_pid = start(spawned, dead, str(helper), "60"), start(spawned, dead)

    tagged = [pid for pid, _ in testrun.tagged_processes().get(str(dead), [])]

    assert plain_pid in tagged
    assert helper_pid not in tagged


# A process that sets its title as Celery's worker and beat do (setproctitle).
TITLED = """
import sys, time, setproctitle
setproctitle.setproctitle("[celeryd: a title longer than its command line] " * 4)
print("titled", flush=True)
time.sleep(60)
"""


def test_a_process_title_set_under_a_run_does_not_hide_the_runs_id(
    monkeypatch: pytest.MonkeyPatch, spawned: list[subprocess.Popen[bytes]]
):
    monkeypatch.setenv(testrun.ENV, "")  # start_run's changes are undone after the test
    monkeypatch.setenv("SPT_NOENV", "")
    run = testrun.start_run()
    titled = subprocess.Popen([sys.executable, "-c", TITLED], stdout=subprocess.PIPE)
    spawned.append(titled)
    assert titled.stdout is not None and titled.stdout.readline() == b"titled\n"

    tagged = testrun.tagged_processes().get(str(run), [])

    assert titled.pid in [pid for pid, _ in tagged]

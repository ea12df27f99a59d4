"""tests/fixtures/testrun.py: which processes and folders belong to which test run, and that
a sweep clears a dead run's and keeps a live run's (real processes, no container engine or
database; the containers tier kills real pytest runs: tests/containers/test_killed_run.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.process_control import proc_start_ticks
from tests.fixtures import testrun
from tests.fixtures.testrun import RunId
from tests.fixtures.testrun_engines import Cleared


@pytest.fixture(autouse=True)
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run folders and processes of this test only: the machine's are other runs'
    (other sessions' dead runs included, which this test must not stop)."""
    root = tmp_path / "runs"
    monkeypatch.setattr(testrun, "runs_root", lambda: root)
    machines = testrun.tagged_processes

    def this_tests() -> dict[str, list[tuple[int, int]]]:
        ours = {entry.name for entry in root.iterdir()} if root.is_dir() else set()
        return {run: found for run, found in machines().items() if run in ours}

    monkeypatch.setattr(testrun, "tagged_processes", this_tests)
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
    # Popen returns once exec has begun; /proc shows the new environment a moment later.
    shown = f"\0{testrun.ENV}={run}\0".encode()
    deadline = time.monotonic() + 10
    while shown not in b"\0" + Path(f"/proc/{process.pid}/environ").read_bytes():
        assert time.monotonic() < deadline, f"{argv}: no {testrun.ENV} in its environment"
        time.sleep(0.01)
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


# A run in a PID namespace of its own (a container sharing the machine's temporary
# folder): its pids name other processes, or none, in this one.
IN_ITS_OWN_NAMESPACE = """
import os, subprocess, sys, time
from pathlib import Path

from tests.fixtures import testrun

testrun.runs_root = lambda: Path(sys.argv[1])
os.environ.pop(testrun.ENV, None)
run = testrun.start_run()
testrun.record("path", sys.argv[2])
server = subprocess.Popen(["sleep", "60"], start_new_session=True)
print(run, flush=True)
time.sleep(60)
"""


def test_a_run_of_another_pid_namespace_is_left_to_its_own_sweep(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
):
    unshare = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    probe = subprocess.run([*unshare, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace can be made here: {probe.stderr.strip()}")
    scratch = tmp_path / "its-scratch"
    scratch.mkdir()
    repo = Path(__file__).resolve().parents[2]
    other = subprocess.Popen(
        [*unshare, sys.executable, "-c", IN_ITS_OWN_NAMESPACE, str(testrun.runs_root()),
         str(scratch)],
        env=os.environ | {"PYTHONPATH": str(repo)}, stdout=subprocess.PIPE,
    )  # fmt: skip
    spawned.append(other)
    assert other.stdout is not None
    run = RunId.parse(other.stdout.readline().decode())
    assert run is not None and run.pidns != RunId.of_this_process().pidns
    deadline = time.monotonic() + 10
    while not (servers := testrun.tagged_processes().get(str(run))):
        assert time.monotonic() < deadline, "its server never showed its run id here"
        time.sleep(0.05)

    cleared = testrun.sweep()

    assert str(run) not in [result.run for result in cleared]
    assert all(running(pid) for pid, _ in servers)
    assert scratch.is_dir() and run.folder.is_dir()


def test_podmans_helpers_are_never_stopped(tmp_path: Path, spawned: list[subprocess.Popen[bytes]]):
    # aardvark-dns, started under a run by the podman command that first needed it, serves
    # every container network on the machine, other runs' and the user's.
    helper = tmp_path / "aardvark-dns"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", helper)
    dead = dead_run()
    dead.folder.mkdir(parents=True)  # what start_run makes (and this test's processes go by)
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


def test_a_run_of_an_earlier_boot_never_signals_a_process_of_this_boot(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
):
    # Its folder is kept where the temporary folder survives a reboot; start ticks count
    # from boot, so a process of the user's may have its recorded pid and ticks.
    users = subprocess.Popen(["sleep", "60"])  # no run id: the user's own
    spawned.append(users)
    ticks = proc_start_ticks(users.pid)
    assert ticks is not None
    earlier = RunId("0earlier0boot", 4242, 777)
    assert not earlier.alive()
    earlier.folder.mkdir(parents=True)
    scratch = tmp_path / "earlier-scratch"
    scratch.mkdir()
    (earlier.folder / "records").write_text(f"process\t{users.pid}:{ticks}\npath\t{scratch}\n")

    testrun.sweep()

    assert proc_start_ticks(users.pid) == ticks
    assert not scratch.exists() and not earlier.folder.exists()  # the rest is cleared


def test_one_dead_runs_unreadable_records_do_not_stop_the_sweep_of_the_others(
    spawned: list[subprocess.Popen[bytes]],
):
    # Written under another user's locale into the shared folder, or cut by a full disk.
    alive = RunId.of_this_process()
    unreadable, other = (RunId(alive.boot, alive.pid, alive.ticks + n) for n in (1, 2))
    unreadable.folder.mkdir(parents=True)
    (unreadable.folder / "records").write_bytes("path\t/tmp/café-run\n".encode("latin-1"))
    unreadables = start(spawned, unreadable)
    other.folder.mkdir()  # what start_run makes (and this test's tagged processes go by)
    leftover = start(spawned, other)

    cleared = {result.run: result for result in testrun.sweep()}

    assert not running(leftover) and not other.folder.exists()
    # What carries the run's id is still stopped; what its records name is left, named.
    assert not running(unreadables)
    assert unreadable.folder.is_dir()
    assert any("records unreadable" in problem for problem in cleared[str(unreadable)].problems)


def test_a_dead_run_that_cannot_be_cleared_is_named_and_the_others_are_cleared(
    monkeypatch: pytest.MonkeyPatch, spawned: list[subprocess.Popen[bytes]]
):
    alive = RunId.of_this_process()
    failing, other = (RunId(alive.boot, alive.pid, alive.ticks + n) for n in (1, 2))
    failing.folder.mkdir(parents=True)
    other.folder.mkdir()
    leftover = start(spawned, other)
    clear = testrun.clear

    def clear_failing(run: RunId, *args: object, **kwargs: object) -> Cleared:
        if run == failing:  # as an error past what clear() expects, its message a URL's
            raise RuntimeError("postgresql://fl:s3cret@db/test")
        return clear(run, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(testrun, "clear", clear_failing)

    cleared = {result.run: result for result in testrun.sweep()}

    assert not running(leftover) and not other.folder.exists()
    assert cleared[str(failing)].problems == ["not cleared: RuntimeError"]  # no password


@pytest.mark.parametrize("tail", [b"", "é".encode()[:1]], ids=["mid-path", "mid-character"])
def test_a_records_line_cut_short_is_never_acted_on(tmp_path: Path, tail: bytes):
    # A full disk cuts the last append: "/tmp/x-scratch" may end up as "/tmp/x", another's.
    someone_elses, runs = tmp_path / "kept", tmp_path / "kept-scratch"
    someone_elses.mkdir()
    runs.mkdir()
    dead = dead_run()
    dead.folder.mkdir(parents=True)
    cut = f"path\t{runs}\npath\t{someone_elses}".encode() + tail
    (dead.folder / "records").write_bytes(cut)

    cleared = testrun.sweep()

    assert someone_elses.is_dir()
    assert not runs.exists() and not dead.folder.exists()  # what its whole lines name goes
    assert not any(result.problems for result in cleared)


# A run's main process (as a pytest session's, without pytest-xdist: `pytest -n 0`, or
# tests/run.sh given arguments) forking a multiprocessing pool, as app.sim's sweep does, and
# leaving it early: Pool.terminate() SIGTERMs the workers still there.
FORKED_POOL_LEFT_EARLY = """
import json, multiprocessing, os, subprocess, sys, time
from pathlib import Path

import pytest

from tests.fixtures import testrun

root = Path(sys.argv[1])
testrun.runs_root = lambda: root  # this run's folder only, and its processes only:
machines = testrun.tagged_processes  # nothing of the machine's other runs is touched
testrun.tagged_processes = lambda: {
    run: found for run, found in machines().items() if (root / run).is_dir()
}


class PluginManager:
    def getplugin(self, name):
        return None


class Config:
    stash = pytest.Stash()
    pluginmanager = PluginManager()


config = Config()
os.environ.pop(testrun.ENV, None)
testrun.pytest_configure(config)  # this process is now a live run's main process
run = testrun.current()
server = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a server it started
scratch = root.parent / "scratch"
scratch.mkdir()
testrun.record("path", str(scratch))  # a folder it made, as PrivatePostgres records its own
with multiprocessing.get_context("fork").Pool(2) as pool:
    # Both workers busy, as the sweep's are when its consumer returns with seeds left.
    busy = [pool.apply_async(time.sleep, (30,)) for _ in range(2)]
    time.sleep(1)
time.sleep(0.5)
kept = {"server": server.poll() is None, "folder": scratch.is_dir(), "run": run.folder.is_dir()}
print(json.dumps(kept), flush=True)
server.kill()
testrun.pytest_unconfigure(config)
"""


def test_a_pool_forked_by_a_runs_main_process_and_left_early_leaves_the_live_run_alone(
    tmp_path,
):
    repo = Path(__file__).resolve().parents[2]
    script = tmp_path / "forked_pool_left_early.py"
    script.write_text(FORKED_POOL_LEFT_EARLY)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")],
        cwd=repo,
        env=os.environ | {"PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"server": True, "folder": True, "run": True}, done.stderr

"""The local driver adopts only the server its own start launched and never recorded
(`LocalDriver._orphan`, its scaler killed between the launch and the record): it never
signals or adopts a process it did not start, a server of the same kit started by hand
while nothing was launching included (break-it on the adoption's first version: a failed
launch's marker made a later hand-started server the net's, and scale(0) killed it).

No NVFLARE needed: a hand-started server is a stand-in Python process whose command line
holds the server module and the kit path as exact arguments, as `sub_start.sh` runs it; it
runs in its own session, as the real one does, so a stop by the driver would reach it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import process_control
from app.adapters.drivers import local as local_driver
from app.adapters.drivers.local import LocalDriver

pytestmark = [pytest.mark.integration]

NET = "orphan-net"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def kit(tmp_path: Path) -> Path:
    """A server kit as far as the driver reads one: startup/fed_server.json's target."""
    kit = tmp_path / "server-kit"
    (kit / "startup").mkdir(parents=True)
    config = {"servers": [{"service": {"target": f"127.0.0.1:{_free_port()}"}}]}
    (kit / "startup" / "fed_server.json").write_text(json.dumps(config))
    return kit.resolve()


@pytest.fixture
def hand_started(kit: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _hand_start(
    kit: Path, started: list[subprocess.Popen[bytes]], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A server of this kit: an operator's, started by hand (no `env`), or a start's own
    launch (`env`: the launch id the driver gives it)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(120)",
            "-m",
            local_driver._SERVER_MODULE,
            "-m",
            str(kit),
            "-s",
            "fed_server.json",
        ],
        start_new_session=True,
        env={**os.environ, **env} if env else None,
    )
    started.append(proc)
    deadline = time.monotonic() + 10
    while local_driver._SERVER_MODULE not in (process_control.proc_cmdline(proc.pid) or []):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc


def _a_launch_that_failed(driver: LocalDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start whose launch failed before any process existed (Popen: EMFILE/ENOMEM, the
    log dir unwritable): `_start` wrote its `launching_at` marker first; the error is the
    start's failure, nothing was launched, and the marker stays until the next scale call
    (reconcile's scale(0) for the failed start, or a later start)."""

    def refuse(_env: dict[str, str]) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(driver, "_launch", refuse)
    with pytest.raises(OSError):
        driver.scale(1)
    monkeypatch.undo()


def test_a_failed_launch_marker_makes_a_later_hand_started_server_ours_and_scale_0_kills_it(
    kit: Path, tmp_path: Path, hand_started, monkeypatch: pytest.MonkeyPatch
):
    """Sequence: a start's launch fails (no process created); its `launching_at` stays in
    the state file (desired=1, no pid). Later (here 2 s; any time after) an operator starts
    a server of the same kit by hand while nothing is launching (likely: the driver just
    failed to start it). observe() reads it as the
    net's server (not "no local server process recorded"), and the next scale(0) (idle
    scale-down, reconcile's abandon) adopts it and SIGTERMs it: a process the driver did not
    start is signalled."""
    driver = LocalDriver(NET, kit, tmp_path / "state")
    _a_launch_that_failed(driver, monkeypatch)
    operator = _hand_start(kit, hand_started)
    seen = driver.observe()
    driver.scale(0)
    time.sleep(0.3)
    assert operator.poll() is None, (
        f"the driver stopped a hand-started server it never launched (observe said {seen})"
    )


def test_a_failed_launch_marker_reads_a_later_hand_started_server_as_the_nets(
    kit: Path, tmp_path: Path, hand_started, monkeypatch: pytest.MonkeyPatch
):
    """Same sequence, observe()'s side: after the failed launch the net has no server of
    its own (a failure to report); a hand-started server of the kit, started after it,
    is read as the net's (pending, no failure) and adopted as ours."""
    driver = LocalDriver(NET, kit, tmp_path / "state")
    _a_launch_that_failed(driver, monkeypatch)
    before = driver.observe()
    assert before.failure == "no local server process recorded"
    _hand_start(kit, hand_started)
    after = driver.observe()
    assert after.failure is not None and after.pending == 0, (
        f"a hand-started server read as the net's own: {after}"
    )


def _marker(state_dir: Path, kit: Path, launch_id: str = "launch-1") -> None:
    """The state `_start` writes before `_launch` (desired=1, its launch id, no pid), left
    as it is by a scaler killed (OOM, SIGKILL) before it recorded a pid."""
    state_dir.mkdir(parents=True, exist_ok=True)
    marker = {"desired": 1, "kit": str(kit), "launch_id": launch_id}
    (state_dir / f"{NET}.json").write_text(json.dumps(marker))
    (state_dir / f"{NET}.lock").touch()  # made by the scale that wrote the marker


@pytest.mark.parametrize("hand_first", [True, False], ids=["just-before", "after"])
def test_a_marker_whose_launch_never_happened_adopts_no_server_started_by_hand(
    kit: Path, tmp_path: Path, hand_started, hand_first: bool
):
    """A scaler killed after its launch marker and before the launch: the marker stays, no
    process was created. A server of the kit started by hand just before the start (not
    listening yet when the start checked the port) or seconds after is not the start's: it
    does not carry its launch id. Not read as the net's, not stopped (break-it: a window of
    start times around the marker took both)."""
    state_dir = tmp_path / "state"
    # The order alone matters: a server is the start's by the launch id it carries, never
    # by when it was started (a window of start times took both).
    if hand_first:
        operator = _hand_start(kit, hand_started)
        _marker(state_dir, kit)
    else:
        _marker(state_dir, kit)
        operator = _hand_start(kit, hand_started)
    driver = LocalDriver(NET, kit, state_dir)
    assert driver.observe().failure == "no local server process recorded"
    driver.scale(0)
    time.sleep(0.3)
    assert operator.poll() is None


def test_a_start_s_own_server_forked_late_is_adopted_and_stopped(
    kit: Path, tmp_path: Path, hand_started
):
    """The launch's work before its fork took seconds (a slow disk, a loaded host), then its
    worker was killed before it recorded the pid: the server carries the launch id, so a
    scale-down adopts and stops it, whenever it was created (break-it: a 2 s window left it
    running, and a scale-up would have started a second)."""
    state_dir = tmp_path / "state"
    _marker(state_dir, kit)
    ours = _hand_start(kit, hand_started, {local_driver.LAUNCH_ENV: "launch-1"})
    driver = LocalDriver(NET, kit, state_dir)
    assert driver.observe().failure is None
    driver.scale(0)
    ours.wait(timeout=10)
    assert ours.returncode is not None


def test_a_time_limit_right_after_the_fork_leaves_the_server_adoptable(
    kit: Path, tmp_path: Path, hand_started, monkeypatch: pytest.MonkeyPatch
):
    """The launch forked the server, then the task's soft time limit fired inside
    `participants._start` (SoftTimeLimitExceeded from billiard's signal handler) before
    the pid was recorded. The marker stays (it was cleared on any launch error: the live
    server was no start's any more, left running by the abandon's scale-down): adopted and
    stopped."""
    from billiard.exceptions import SoftTimeLimitExceeded

    launched: list[subprocess.Popen[bytes]] = []

    def fork_then_time_limit(*_args: object, env: dict[str, str], **_kwargs: object) -> None:
        launched.append(_hand_start(kit, hand_started, env))
        raise SoftTimeLimitExceeded()

    driver = LocalDriver(NET, kit, tmp_path / "state")
    monkeypatch.setattr(local_driver.participants, "start_server", fork_then_time_limit)
    with pytest.raises(SoftTimeLimitExceeded):
        driver.scale(1)
    monkeypatch.undo()
    driver.scale(0)
    launched[0].wait(timeout=10)
    assert launched[0].returncode is not None

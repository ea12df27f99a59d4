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


def _hand_start(kit: Path, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """An operator's server of this kit, started by hand (not by the driver)."""
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

    def refuse() -> None:
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
    time.sleep(2.0)
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
    time.sleep(1.5)
    _hand_start(kit, hand_started)
    after = driver.observe()
    assert after.failure is not None and after.pending == 0, (
        f"a hand-started server read as the net's own: {after}"
    )


def test_a_marker_whose_launch_never_happened_adopts_no_server_started_later(
    kit: Path, tmp_path: Path, hand_started
):
    """A scaler killed after its launch marker and before the launch: the marker stays, no
    process was created. A server of the kit started by hand seconds later is not the
    start's (created past the launch window): not read as the net's, not stopped."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    marker = {"desired": 1, "kit": str(kit), "launching_at": time.time() - 5.0}
    (state_dir / f"{NET}.json").write_text(json.dumps(marker))
    driver = LocalDriver(NET, kit, state_dir)
    operator = _hand_start(kit, hand_started)
    assert driver.observe().failure == "no local server process recorded"
    driver.scale(0)
    time.sleep(0.3)
    assert operator.poll() is None

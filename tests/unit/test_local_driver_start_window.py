"""The local scale driver seen by another worker while a start is under way.

`scale(1)` records the intent (desired=1) before the server process exists, under the net's
lock; a worker that observes the net in that window (a reconcile round, a readiness poll,
a status view) must read a start in flight, not a failed one: a settling start read as
failed is given up (UNHEALTHY, scaled to 0) and its just-launched server stopped
(`failed_starts.give_up_failed_start`), a job's readiness poll gives its start up.

The driver is the real one on a temp state dir; only the program it launches is a stand-in
(a sleeping Python process whose command line names the server program and the kit, which
is all the driver checks), started through the `_launch` seam the SuperLink driver also
overrides. Two driver instances stand for two workers: the net's lock is an `flock` on a
file each opens itself, so two threads contend for it as two processes do.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.adapters.drivers.local import LocalDriver
from app.adapters.nvflare.participants import ProcessHandle

NET = "window-net"
# The stand-in server: alive until signalled, its port never open (so: booting, pending).
SERVER = "import time; time.sleep(120)"
WAIT_S = 10.0


class Gate:
    """Holds a launch until the test has looked (at most `hold_s`: a fixed observe may wait
    for the lock instead, and the launch must go on for it to end)."""

    def __init__(self, hold_s: float = 2.0) -> None:
        self.launching = threading.Event()
        self.observed = threading.Event()
        self.hold_s = hold_s


class StandInDriver(LocalDriver):
    """The real local driver launching the stand-in server, optionally held at its launch."""

    def __init__(self, kit: Path, state_dir: Path, gate: Gate | None = None) -> None:
        super().__init__(NET, kit, state_dir)
        self.gate = gate

    def _launch(self, env: dict[str, str]) -> ProcessHandle:
        if self.gate is not None:
            self.gate.launching.set()
            self.gate.observed.wait(self.gate.hold_s)
        popen = subprocess.Popen(
            [sys.executable, "-c", SERVER, self.program, self._identity()],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return ProcessHandle(
            name=self.net_name,
            kit=self.server_kit_dir,
            popen=popen,
            log_path=self.state_dir / "logs" / f"{NET}.log",
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


def make_kit(folder: Path) -> Path:
    """A server kit as far as the driver reads one: the endpoint in startup/fed_server.json."""
    startup = folder / "startup"
    startup.mkdir(parents=True)
    target = f"localhost:{free_port()}"
    (startup / "fed_server.json").write_text(
        json.dumps({"servers": [{"service": {"target": target}}]})
    )
    return folder


@pytest.fixture
def kit(tmp_path: Path) -> Path:
    return make_kit(tmp_path / "server")


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "local-driver"
    yield state
    # Whatever a test started is stopped (the driver signals only the process it recorded).
    recorded = state / f"{NET}.json"
    if recorded.exists() and (pid := json.loads(recorded.read_text()).get("pid")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def scale_in_thread(driver: LocalDriver, replicas: int) -> tuple[threading.Thread, list[object]]:
    errors: list[object] = []

    def run() -> None:
        try:
            driver.scale(replicas)
        except Exception as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="scaler")
    thread.start()
    return thread, errors


def test_a_start_in_flight_reads_as_starting_to_another_worker_not_as_failed(
    kit: Path, state_dir: Path
) -> None:
    gate = Gate()
    scaler = StandInDriver(kit, state_dir, gate)
    other_worker = LocalDriver(NET, kit, state_dir)

    thread, errors = scale_in_thread(scaler, 1)
    assert gate.launching.wait(WAIT_S), "the start never reached its launch"
    seen = other_worker.observe()  # desired=1 recorded, no process yet
    gate.observed.set()
    thread.join(WAIT_S)

    assert not thread.is_alive() and errors == []
    assert seen.failure is None, seen
    assert seen.desired == 1 and seen.running == 0 and seen.pending == 1
    after = other_worker.observe()
    assert after.failure is None and after.pending == 1  # the stand-in never opens its port
    scaler.scale(0)
    assert other_worker.observe().desired == 0


def test_replacing_the_server_of_a_previous_kit_is_no_failure_while_the_new_one_starts(
    tmp_path: Path, kit: Path, state_dir: Path
) -> None:
    StandInDriver(make_kit(tmp_path / "previous-server"), state_dir).scale(1)
    gate = Gate()
    scaler = StandInDriver(kit, state_dir, gate)
    other_worker = LocalDriver(NET, kit, state_dir)

    thread, errors = scale_in_thread(scaler, 1)
    assert gate.launching.wait(WAIT_S), "the start never reached its launch"
    seen = other_worker.observe()  # the previous kit's server stopped, the new one not yet up
    gate.observed.set()
    thread.join(WAIT_S)

    assert not thread.is_alive() and errors == []
    assert seen.failure is None, seen
    assert seen.desired == 1 and seen.pending == 1
    scaler.scale(0)


def test_a_start_whose_worker_died_before_its_launch_still_reads_as_failed(
    kit: Path, state_dir: Path
) -> None:
    # A worker killed between recording the intent and launching the server: its lock went
    # with it, and nothing will start the server. That is a failure, as it always was.
    code = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from app.adapters.drivers.local import LocalDriver

        class Dies(LocalDriver):
            def _launch(self, env):
                os.kill(os.getpid(), signal.SIGKILL)

        Dies({NET!r}, Path({str(kit)!r}), Path({str(state_dir)!r})).scale(1)
        """
    )
    worker = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).parents[2], timeout=60, check=False
    )
    assert worker.returncode == -signal.SIGKILL

    seen = LocalDriver(NET, kit, state_dir).observe()
    assert seen.desired == 1 and seen.running == 0 and seen.pending == 0
    assert seen.failure == "no local server process recorded"


def test_a_server_that_exited_reads_as_gone(kit: Path, state_dir: Path) -> None:
    driver = StandInDriver(kit, state_dir)
    driver.scale(1)
    pid = json.loads((state_dir / f"{NET}.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)  # our own child: reaped, so its pid names no process

    seen = LocalDriver(NET, kit, state_dir).observe()
    assert seen.desired == 1 and seen.running == 0 and seen.pending == 0
    assert seen.failure is not None and f"process {pid} is gone" in seen.failure

"""The `local` scale driver: a net's NVFLARE server as a local process started from its kit
(a Flower net's SuperLink: `local_superlink.py`, this driver with another program).

Replica 1 = the server process runs (started without nvflare's watchdog, so "stopped" stays
stopped); replica 0 = it does not. The dispatcher runs in several processes (worker children,
beat, CLI) that come and go, so the driver keeps no state in memory:

- `<state_dir>/<net>.json` records the intent (`desired`) and the server it started: pid,
  the process start time from /proc (pids are reused; a pid plus its start time is not),
  the kit and the port. A process is "our server" only if it is alive, not a zombie, started
  at the recorded time and runs `server_train` on this kit. Anything else is never signalled.
- `scale` holds an exclusive `fcntl` lock on `<state_dir>/<net>.lock`, so two workers asking
  at the same moment start one server, not two; `observe` reads a net wanted up with no
  server while that lock is held as a start under way (pending), not as a failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from app import process_control
from app.adapters.drivers.base import Observation
from app.adapters.nvflare import participants
from app.errors import DriverMisconfigured

log = logging.getLogger(__name__)

_STOP_TIMEOUT_S = 15.0
_POLL_S = 0.05
_SERVER_MODULE = "nvflare.private.fed.app.server.server_train"
# The environment variable that names the start that launched a server (`_State.launch_id`).
LAUNCH_ENV = "FL_DISPATCHER_LAUNCH_ID"

# Servers started by this process, kept so they are reaped through their Popen (no zombie,
# no "still running" warning when a driver instance goes away while its server runs on).
_children: dict[int, participants.ProcessHandle] = {}


def _reap(pid: int) -> None:
    handle = _children.get(pid)
    if handle is None:
        process_control.reap(pid)
    elif handle.popen.poll() is not None:
        _children.pop(pid, None)


@dataclass(frozen=True)
class _State:
    desired: int = 0
    pid: int | None = None
    start_ticks: int | None = None
    kit: str = ""
    port: int | None = None
    started_at: float | None = None
    log: str = ""
    # A start's launch id, written before the launch and given to the server in its
    # environment (`LAUNCH_ENV`): a server of this kit carrying it, with no pid recorded, is
    # that start's (its scaler killed before it recorded the pid) and is adopted, never
    # started a second time; no other process ever carries it.
    launch_id: str | None = None


class LocalDriver:
    """Scales one net's local NVFLARE server between 0 and 1 processes."""

    kind = "local"

    # What names the server program in its command line (one exact argument).
    program = _SERVER_MODULE

    def __init__(self, net_name: str, server_kit_dir: Path, state_dir: Path) -> None:
        self.net_name = net_name
        self.server_kit_dir = server_kit_dir.resolve()
        self.state_dir = state_dir
        self._state_path = state_dir / f"{net_name}.json"
        self._lock_path = state_dir / f"{net_name}.lock"

    # --- public ------------------------------------------------------------------------------

    def scale(self, replicas: int) -> None:
        """Start (1) or stop (0) the server; idempotent and safe across processes."""
        if replicas not in (0, 1):
            raise ValueError(f"net {self.net_name}: a local server has 0 or 1 replicas")
        with self._locked():
            state = self._read_state()
            orphan = self._orphan(state)
            if orphan is not None:
                # Ours, never recorded: adopted, so it is kept (scale 1) or stopped (scale 0),
                # never joined by a second server or left running.
                self._write_state(orphan)
                log.warning(
                    "net %s: adopted local server pid=%s, launched by a start whose worker "
                    "was killed before it recorded it",
                    self.net_name,
                    orphan.pid,
                )
                state = orphan
            alive = self._is_our_server(state)
            if replicas == 1 and alive and state.kit == self._identity():
                self._write_state(replace(state, desired=1))
                return
            # Record the intent first: a crash mid-stop must not read as "wanted up".
            self._write_state(replace(state, desired=replicas))
            if alive and state.pid is not None and state.start_ticks is not None:
                # scale(0), or scale(1) replacing our server of the net's previous kit.
                self._stop(state.pid, state.start_ticks)
            if replicas == 1:
                self._start(state)
            else:
                self._write_state(_State(desired=0))

    def observe(self) -> Observation:
        """desired from the recorded intent; running = our process alive and its port open;
        pending = alive but the port not open yet (booting), or a start under way in
        another worker (the intent recorded, the process not yet)."""
        state, alive, starting = self._observed_state()
        host, port = self._endpoint()  # an unreadable kit is misconfigured, starting or not
        if starting:
            return Observation(desired=1, running=0, pending=1)
        port_open = alive and process_control.port_open(host, port)
        failure = None
        if state.desired == 1 and not alive:
            failure = (
                f"local server process {state.pid} is gone (see {state.log})"
                if state.pid is not None
                else "no local server process recorded"
            )
        return Observation(
            desired=state.desired,
            running=1 if port_open else 0,
            pending=1 if alive and not port_open else 0,
            failure=failure,
        )

    def server_process(self) -> tuple[int, int] | None:
        """(pid, start ticks) of the live server this driver started, or None."""
        state = self._read_state()
        if not self._is_our_server(state) or state.pid is None or state.start_ticks is None:
            return None
        return state.pid, state.start_ticks

    # --- state -------------------------------------------------------------------------------

    def _observed_state(self) -> tuple[_State, bool, bool]:
        """The recorded state, whether its server is ours and alive, and whether a start is
        under way in another worker. `scale` records desired=1 before the process exists
        (and, replacing a previous kit's server, stops that one first), under the net's
        lock: desired with no live server is a start in flight while that lock is held,
        and only a failure once it is free (the scaler done, or dead: the lock goes with
        it). Read without waiting for a scale, so a status view never hangs on a start."""
        state = self._read_state()
        alive = self._is_our_server(state)
        if state.desired != 1 or alive:
            return state, alive, False
        try:
            # Not created here: desired=1 is only ever written under the lock, by then made.
            fd = os.open(self._lock_path, os.O_RDONLY)
        except OSError:
            return state, alive, False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return state, alive, True
            # No scale holds it now; one may have ended since the first read: read again.
            state = self._read_state()
            alive = self._is_our_server(state)
            orphan = None if alive else self._orphan(state)
            if orphan is not None:
                return orphan, True, False  # a start's server it never recorded: up
            return state, alive, False
        finally:
            os.close(fd)  # closing releases the shared lock

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise DriverMisconfigured(
                f"net {self.net_name}: cannot use state dir {self.state_dir}: {exc.strerror}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _read_state(self) -> _State:
        try:
            raw = json.loads(self._state_path.read_text())
        except FileNotFoundError:
            return _State()
        except (OSError, ValueError):
            log.warning(
                "net %s: unreadable driver state %s; assuming stopped",
                self.net_name,
                self._state_path,
            )
            return _State()
        fields = set(_State.__dataclass_fields__)
        return _State(**{k: v for k, v in raw.items() if k in fields})

    def _write_state(self, state: _State) -> None:
        # Write-then-rename: a reader (observe, another process) never sees half a file.
        tmp = self._state_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self._state_path)

    def _identity(self) -> str:
        """The argument of the server's command line that names this net's own server (two
        nets' servers run the same program): its kit."""
        return str(self.server_kit_dir)

    def _launch(self, env: dict[str, str]) -> participants.ProcessHandle:
        """Start the server process with `env` set for it; returns at once."""
        return participants.start_server(
            self.server_kit_dir,
            log_dir=self.state_dir / "logs",
            track=False,  # the server must outlive the worker that started it
            name=self.net_name,
            env=env,
        )

    def _endpoint(self) -> tuple[str, int]:
        try:
            return participants.server_endpoint(self.server_kit_dir)
        except (OSError, ValueError, KeyError, IndexError) as exc:
            raise DriverMisconfigured(
                f"net {self.net_name}: {self.server_kit_dir} is not a readable NVFLARE server "
                f"kit (startup/fed_server.json): {exc}"
            ) from exc

    # --- process identity --------------------------------------------------------------------

    def _is_our_server(self, state: _State) -> bool:
        """True only for the very process this driver started (pid reuse and foreign
        processes are told apart by start time and command line)."""
        if state.pid is None or state.start_ticks is None:
            return False
        _reap(state.pid)  # our own exited child would otherwise linger as a zombie
        if process_control.proc_start_ticks(state.pid) != state.start_ticks:
            return False
        cmdline = process_control.proc_cmdline(state.pid) or []
        return self.program in cmdline and bool(state.kit) and state.kit in cmdline

    # --- start / stop ------------------------------------------------------------------------

    def _start(self, previous: _State) -> None:
        host, port = self._endpoint()
        if process_control.port_open(host, port):
            holders = [
                f"{pid} ({' '.join((process_control.proc_cmdline(pid) or ['?'])[:4])})"
                for pid in process_control.listener_pids(port)
            ]
            raise DriverMisconfigured(
                f"net {self.net_name}: {host}:{port} is already served by a process this "
                f"driver did not start ({', '.join(holders) or 'unknown'}); stop it or give "
                "the net its own port"
            )
        if previous.pid is not None:
            log.info(
                "net %s: recorded server %s is gone; starting a new one",
                self.net_name,
                previous.pid,
            )
        # Written first: a scaler killed at any point after it (before the record below, a
        # time limit inside the launch) leaves a server the next scale call adopts by it.
        launch_id = uuid.uuid4().hex
        self._write_state(_State(desired=1, kit=self._identity(), port=port, launch_id=launch_id))
        handle = self._launch({LAUNCH_ENV: launch_id})
        _children[handle.pid] = handle
        ticks = process_control.proc_start_ticks(handle.pid)
        # Hold the lock until the child has exec'd the server: before that its cmdline is ours,
        # and another worker would not recognise it and start a second server.
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while self.program not in (process_control.proc_cmdline(handle.pid) or []):
            if not handle.alive() or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S / 5)
        self._write_state(
            _State(
                desired=1,
                pid=handle.pid,
                start_ticks=ticks,
                kit=self._identity(),
                port=port,
                started_at=handle.started_at,
                log=str(handle.log_path),
            )
        )
        log.info(
            "net %s: started local server pid=%s on %s:%s", self.net_name, handle.pid, host, port
        )

    def _orphan(self, state: _State) -> _State | None:
        """The state with the server a start launched and never recorded (its scaler killed
        between the launch and the record: the state holds its launch id, no pid): the
        server of this kit whose environment carries that id; None if there is none."""
        if state.desired != 1 or state.pid is not None or state.launch_id is None:
            return None
        for pid in process_control.pids_running(self.program, self._identity()):
            environ = process_control.proc_environ(pid) or {}
            ticks = process_control.proc_start_ticks(pid)
            if environ.get(LAUNCH_ENV) == state.launch_id and ticks is not None:
                return _State(
                    desired=1,
                    pid=pid,
                    start_ticks=ticks,
                    kit=self._identity(),
                    port=state.port,
                    started_at=process_control.proc_created_at(pid),
                )
        return None

    def _stop(self, pid: int, ticks: int) -> None:
        # The server's pid is its process group (own session); its job processes are found
        # through /proc (nvflare gives them sessions of their own).
        process_control.terminate_tree(
            pid, sig=signal.SIGTERM, timeout=_STOP_TIMEOUT_S, reap=_reap, expected_ticks=ticks
        )
        log.info("net %s: stopped local server pid=%s", self.net_name, pid)

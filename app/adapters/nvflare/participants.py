"""NVFLARE participants as local processes: start a server or site from its provisioned
startup kit exactly as `startup/sub_start.sh --once` would, and stop it with every job process
it spawned. Used by the local scale driver (the embedded default) and the local harness."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.adapters.child_env import child_environment
from app.process_control import STOP_TIMEOUT_S, terminate_tree

logger = logging.getLogger(__name__)

LOOPBACK_HOST = "localhost"
# `start_python() { exec python3 -u -m <module> -m "$WORKSPACE" -s <file> --set <args...> }`
_EXEC_LINE_RE = re.compile(r"^\s*exec python3 (?P<args>.+)$", re.MULTILINE)


@dataclass
class ProcessHandle:
    """One started NVFLARE participant process (the leader of its own process group)."""

    name: str
    kit: Path
    popen: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        """The participant's python process id (also its process group id)."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the participant process has not exited."""
        return self.popen.poll() is None


# Processes started with track=True are stopped at interpreter exit, so a failed test or an
# interrupted demo leaves no orphan. The local driver opts out: its server must outlive the
# worker that started it.
_tracked: dict[int, ProcessHandle] = {}
_tracked_lock = threading.Lock()


def _stop_tracked() -> None:
    with _tracked_lock:
        handles = list(_tracked.values())
    for handle in handles:
        with contextlib.suppress(Exception):
            kill(handle)


atexit.register(_stop_tracked)


def server_endpoint(server_kit: Path) -> tuple[str, int]:
    """(host, port) the server kit's `fed_server.json` serves on (its `service.target`)."""
    config = json.loads((server_kit / "startup" / "fed_server.json").read_text())
    target = str(config["servers"][0]["service"]["target"])
    host, _, port = target.rpartition(":")
    return host or LOOPBACK_HOST, int(port)


def kit_command(kit: Path) -> list[str]:
    """The command line `startup/sub_start.sh --once` would exec for this kit, with this python.

    Read from the kit itself so the arguments (`uid=`, `org=`, ...) are exactly the provisioned
    ones; `python3` on PATH may not be the interpreter that has nvflare installed.
    """
    kit = kit.resolve()
    script = (kit / "startup" / "sub_start.sh").read_text()
    match = _EXEC_LINE_RE.search(script)
    if match is None:
        raise ValueError(f"{kit}/startup/sub_start.sh has no 'exec python3 ...' line")
    args = shlex.split(match.group("args").replace('"$WORKSPACE"', shlex.quote(str(kit))))
    return [sys.executable, *args]


def _start(
    kit: Path, name: str, log_dir: Path | None, track: bool, env: Mapping[str, str] | None = None
) -> ProcessHandle:
    kit = kit.resolve()
    log_dir = log_dir or kit.parent.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    command = kit_command(kit)
    (kit / "transfer").mkdir(exist_ok=True)  # sub_start.sh creates it before exec
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} start {name}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            command,
            cwd=kit,
            env=child_environment(env),  # none of the dispatcher's settings or secrets
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Own session = own process group: stop() signals the job processes it spawns too,
            # and a Ctrl-C in the parent's terminal does not reach it.
            start_new_session=True,
        )
    handle = ProcessHandle(name=name, kit=kit, popen=popen, log_path=log_path)
    if track:
        with _tracked_lock:
            _tracked[handle.pid] = handle
    logger.info("started %s pid=%s (log %s)", name, handle.pid, log_path)
    return handle


def start_server(
    kit: Path,
    *,
    log_dir: Path | None = None,
    track: bool = True,
    name: str = "server",
    env: Mapping[str, str] | None = None,
) -> ProcessHandle:
    """Start the server from its kit folder; returns at once.

    The log goes to `log_dir/<name>.log` (default: the deployment's `logs/` folder). `env`:
    variables set for it on top of this process's.
    """
    return _start(kit, name, log_dir, track, env)


def start_site(site_kit: Path, *, log_dir: Path | None = None, track: bool = True) -> ProcessHandle:
    """Start one client site from its kit folder; it registers with the server by itself."""
    return _start(site_kit, site_kit.resolve().name, log_dir, track)


def stop(
    handle: ProcessHandle, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S
) -> int | None:
    """Stop the participant and every process it spawned (see `terminate_tree`).

    Returns the participant's exit code (None only if it could not be reaped).
    """
    terminate_tree(handle.pid, sig=sig, timeout=timeout, reap=lambda _pid: handle.popen.poll())
    try:
        code: int | None = handle.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    with _tracked_lock:
        _tracked.pop(handle.pid, None)
    return code


def kill(handle: ProcessHandle, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """SIGKILL the participant and everything it spawned: a crash, as when a container dies."""
    return stop(handle, signal.SIGKILL, timeout)

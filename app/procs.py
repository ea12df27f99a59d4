"""Generic process helpers (Linux): ports, /proc parsing, process trees. Used by the local
scale driver to recognise and stop its server across dispatcher restarts, and by the local
harness and tests."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 15.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on host:port right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port(host: str, port: int, timeout: float, *, interval: float = 0.05) -> None:
    """Poll until host:port accepts connections; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not port_open(host, port, timeout=min(0.5, timeout)):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{host}:{port} did not open within {timeout:.1f} s")
        time.sleep(interval)


def wait_port_closed(host: str, port: int, timeout: float, *, interval: float = 0.05) -> None:
    """Poll until host:port refuses connections; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while port_open(host, port, timeout=min(0.5, timeout)):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{host}:{port} still open after {timeout:.1f} s")
        time.sleep(interval)


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


# --- /proc helpers (Linux) used to recognise a server across dispatcher restarts -------------


def _stat_fields(path: Path) -> list[str] | None:
    try:
        stat = path.read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses; the rest follows the last ')'.
    return stat[stat.rindex(")") + 2 :].split()


def proc_start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot, or None if there is no such live process.

    A zombie counts as dead (it holds no socket any more), but only once every thread is
    gone: when the main thread of a multi-threaded process exits first, /proc shows the
    process as a zombie while its other threads still run and still serve its port.
    """
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    if fields is None:
        return None
    if fields[0] in ("Z", "X"):
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            return None
        states = [f[0] for t in tasks if (f := _stat_fields(t / "stat")) is not None]
        if all(state in ("Z", "X") for state in states):
            return None
    return int(fields[19])  # field 22 overall: starttime


def proc_cmdline(pid: int) -> list[str] | None:
    """The process's argv, or None if it is gone or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def listener_pids(port: int) -> list[int]:
    """Pids of the processes listening on TCP `port` (from /proc/net; for error messages)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{inode}]")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
    return pids


def reap(pid: int) -> None:
    """Collect the exit status if `pid` is our exited child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def process_tree(pid: int) -> list[tuple[int, int]]:
    """(pid, start ticks) of every live descendant of `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[tuple[int, int]] = []
    pending = list(children.get(pid, []))
    while pending:
        child = pending.pop()
        ticks = proc_start_ticks(child)
        if ticks is not None:
            found.append((child, ticks))
        pending.extend(children.get(child, []))
    return found


def _signal_members(members: Sequence[tuple[int, int]], sig: int) -> None:
    for pid, ticks in members:
        if proc_start_ticks(pid) == ticks:  # never a process that merely reuses the pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _members_gone(
    members: Sequence[tuple[int, int]], timeout: float, reap_fn: Callable[[int], object]
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        for pid, _ticks in members:
            reap_fn(pid)
        if all(proc_start_ticks(pid) != ticks for pid, ticks in members):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def terminate_tree(
    pid: int,
    *,
    sig: int = signal.SIGTERM,
    timeout: float = STOP_TIMEOUT_S,
    reap: Callable[[int], object] = reap,
    expected_ticks: int | None = None,
) -> None:
    """Stop a participant started in its own session, and the job processes it spawned.

    nvflare 2.9 starts each job process with `setsid` (utils/process_utils.py), so a job
    process is NOT in its parent's process group and survives a group kill, orphaned. The
    tree is therefore read from /proc while the parent still lives, every member is signalled
    (by pid AND start time, so a reused pid is never hit), and after the parent has exited
    its job processes get a short grace and then SIGKILL. With `expected_ticks`, nothing is
    signalled unless `pid` is still the process that started at that time.
    """
    ticks = proc_start_ticks(pid)
    if ticks is None or (expected_ticks is not None and ticks != expected_ticks):
        reap(pid)
        return
    leader = [(pid, ticks)]
    spawned = process_tree(pid)
    signal_group(pid, sig)
    _signal_members(spawned, sig)
    if not _members_gone(leader, timeout, reap):
        logger.warning("pid=%s ignored signal %s; killing", pid, sig)
        signal_group(pid, signal.SIGKILL)
        _members_gone(leader, timeout, reap)
    if not _members_gone(spawned, min(5.0, timeout), reap):
        _signal_members(spawned, signal.SIGKILL)
        _members_gone(spawned, timeout, reap)
    if proc_start_ticks(pid) is None:
        # Anything left in the leader's group; safe while no new process owns the pid.
        signal_group(pid, signal.SIGKILL)

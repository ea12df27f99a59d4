"""Process helpers (Linux, through psutil): ports, a process's identity (pid and start time)
and command line, process trees and stopping them. Used by the local scale driver to
recognise and stop its server across dispatcher restarts, and by the local harness and tests."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence

import psutil

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


# --- process identity and trees (psutil), to recognise a server across dispatcher restarts ---

_EXITED = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _process(pid: int) -> psutil.Process | None:
    if pid <= 0:  # psutil refuses these; no process has them
        return None
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _start_ticks(pid: int) -> int:
    """The kernel's start time of `pid` in clock ticks since boot: the value the local driver
    records (older versions read it from /proc themselves). psutil gives it as wall-clock
    seconds, the boot time plus those ticks; the boot time moves only with a clock step, and
    a step while it is read is read again."""
    while True:
        boot = psutil.boot_time()
        started = psutil.Process(pid).create_time()
        if psutil.boot_time() == boot:
            return round((started - boot) * _CLOCK_TICKS)


def proc_start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot, or None if there is no such live process.

    A zombie counts as dead (it holds no socket any more), but only once every thread is
    gone: when the main thread of a multi-threaded process exits first, the process shows as
    a zombie while its other threads still run and still serve its port.
    """
    process = _process(pid)
    if process is None:
        return None
    try:
        # An exited process keeps only its main thread: more means another still runs.
        if process.status() in _EXITED and process.num_threads() <= 1:
            return None
        return _start_ticks(pid)
    except psutil.Error:
        return None


def proc_cmdline(pid: int) -> list[str] | None:
    """The process's argv, or None if it is gone or unreadable."""
    process = _process(pid)
    if process is None:
        return None
    try:
        return process.cmdline()
    except psutil.Error:
        return None


def proc_created_at(pid: int) -> float | None:
    """When the process started (epoch seconds), or None if it is gone or unreadable."""
    process = _process(pid)
    if process is None:
        return None
    try:
        return float(process.create_time())
    except psutil.Error:
        return None


def proc_environ(pid: int) -> dict[str, str] | None:
    """The process's environment, or None if it is gone or unreadable (another user's)."""
    process = _process(pid)
    if process is None:
        return None
    try:
        return dict(process.environ())
    except psutil.Error:
        return None


def pids_running(*args: str) -> list[int]:
    """Live processes whose command line holds every one of `args` (exact arguments)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if all(arg in cmdline for arg in args) and proc_start_ticks(process.pid) is not None:
            found.append(process.pid)
    return sorted(found)


def listener_pids(port: int) -> list[int]:
    """Pids of the processes listening on TCP `port` (for error messages)."""
    return sorted(
        {
            conn.pid
            for conn in psutil.net_connections(kind="tcp")
            if conn.status == psutil.CONN_LISTEN
            and conn.laddr
            and conn.laddr.port == port
            and conn.pid is not None
        }
    )


def reap(pid: int) -> None:
    """Collect the exit status if `pid` is our exited child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def process_tree(pid: int) -> list[tuple[int, int]]:
    """(pid, start ticks) of every live descendant of `pid`."""
    process = _process(pid)
    if process is None:
        return []
    try:
        descendants = process.children(recursive=True)
    except psutil.Error:
        return []
    found: list[tuple[int, int]] = []
    for child in descendants:
        ticks = proc_start_ticks(child.pid)
        if ticks is not None:
            found.append((child.pid, ticks))
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
    tree is therefore read while the parent still lives, every member is signalled
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

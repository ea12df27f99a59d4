"""app.process_control against real processes: the start time that identifies a server
across dispatcher restarts, its command line, who listens on a port, process trees and
stopping them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import process_control

# A child that keeps running until killed (and says when it is ready).
SLEEPER = "import time; print('ready', flush=True); time.sleep(120)"

# A leader that starts a child in a session of its own, as nvflare 2.9 starts job processes,
# and prints that child's pid.
LEADER = f"""
import subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c", {SLEEPER!r}], stdout=subprocess.PIPE, start_new_session=True
)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(120)
"""

Children = list[subprocess.Popen[str]]


@pytest.fixture
def children() -> Iterator[Children]:
    started: Children = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait(10)


def spawn(children: Children, code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    """A Python child running `code` in a session of its own (as participants are started),
    and the first line it printed, once printed."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    children.append(child)
    assert child.stdout is not None
    return child, child.stdout.readline().strip()


def stat_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, read here independently of app.process_control: the value a
    running local driver stored before an upgrade must still match."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def wait_zombie(pid: int) -> None:
    """Until /proc shows `pid` (its main thread) as a zombie."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":
        assert time.monotonic() < deadline, f"{pid} never became a zombie"
        time.sleep(0.02)


def no_reap(pid: int) -> None:
    """Leaves our exited child to Popen, which then reports how it ended."""


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while process_control.proc_start_ticks(pid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_start_ticks_are_the_kernels_start_time_of_a_live_process(children):
    child, _ = spawn(children, SLEEPER)
    assert process_control.proc_start_ticks(child.pid) == stat_ticks(child.pid)
    assert process_control.proc_start_ticks(os.getpid()) == stat_ticks(os.getpid())


def test_a_zombie_and_a_missing_pid_have_no_start_ticks(children):
    child, _ = spawn(children, SLEEPER)
    os.kill(child.pid, signal.SIGKILL)
    wait_zombie(child.pid)
    assert process_control.proc_start_ticks(child.pid) is None  # exited, not yet reaped
    process_control.reap(child.pid)
    assert not Path(f"/proc/{child.pid}").exists()
    assert process_control.proc_start_ticks(child.pid) is None
    child.returncode = -signal.SIGKILL  # reaped above: Popen must not wait for it


def test_a_process_whose_main_thread_exited_lives_while_another_thread_runs(children):
    # The main thread leaves (pthread_exit) while a second thread still runs: /proc shows the
    # process as a zombie, yet it still serves its port through that thread.
    child, _ = spawn(
        children,
        """
        import ctypes, threading, time
        threading.Thread(target=time.sleep, args=(120,)).start()
        print("ready", flush=True)
        ctypes.CDLL(None).pthread_exit(None)
        """,
    )
    wait_zombie(child.pid)
    assert process_control.proc_start_ticks(child.pid) == stat_ticks(child.pid)


def test_cmdline_is_the_argv_of_a_live_process_and_none_once_gone(children):
    child, _ = spawn(children, SLEEPER, "first arg", "--flag")
    assert process_control.proc_cmdline(child.pid) == [
        sys.executable,
        "-c",
        SLEEPER,
        "first arg",
        "--flag",
    ]
    child.kill()
    child.wait(10)
    assert process_control.proc_cmdline(child.pid) is None


def test_listener_pids_names_the_process_listening_on_a_port_and_no_other(children):
    child, port = spawn(
        children,
        """
        import socket, time
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        print(sock.getsockname()[1], flush=True)
        time.sleep(120)
        """,
    )
    assert process_control.listener_pids(int(port)) == [child.pid]
    # The other end of a connection to it is not a listener.
    with socket.create_connection(("127.0.0.1", int(port))) as conn:
        assert process_control.listener_pids(conn.getsockname()[1]) == []
    assert process_control.listener_pids(process_control.free_port()) == []


def test_process_tree_holds_every_live_descendant_even_in_another_session(children):
    leader, line = spawn(children, LEADER)
    grandchild = int(line)
    try:
        assert process_control.process_tree(leader.pid) == [(grandchild, stat_ticks(grandchild))]
        assert process_control.process_tree(grandchild) == []
    finally:
        os.kill(grandchild, signal.SIGKILL)


def test_terminate_tree_stops_the_leader_and_what_it_spawned_in_another_session(children):
    leader, line = spawn(children, LEADER)
    grandchild = int(line)
    try:
        process_control.terminate_tree(leader.pid, timeout=5, reap=no_reap)
        assert leader.wait(1) == -signal.SIGTERM
        assert gone(grandchild), "the job process in its own session survived"
    finally:
        if not gone(grandchild, 0):
            os.kill(grandchild, signal.SIGKILL)


def test_terminate_tree_kills_a_leader_that_ignores_sigterm(children):
    stubborn, _ = spawn(
        children,
        """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(120)
        """,
    )
    process_control.terminate_tree(stubborn.pid, timeout=0.5, reap=no_reap)
    assert stubborn.wait(1) == -signal.SIGKILL


def test_terminate_tree_leaves_alone_a_pid_that_started_at_another_time(children):
    child, _ = spawn(children, SLEEPER)
    ticks = process_control.proc_start_ticks(child.pid)
    assert ticks is not None
    process_control.terminate_tree(child.pid, timeout=0.5, reap=no_reap, expected_ticks=ticks - 1)
    assert child.poll() is None  # the pid was reused: not the process that was started
    process_control.terminate_tree(child.pid, timeout=5, reap=no_reap, expected_ticks=ticks)
    assert child.wait(1) == -signal.SIGTERM


def test_ports_open_and_close():
    port = process_control.free_port()
    assert not process_control.port_open("127.0.0.1", port)
    with pytest.raises(TimeoutError):
        process_control.wait_port("127.0.0.1", port, 0.2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        process_control.wait_port("127.0.0.1", port, 5)
        with pytest.raises(TimeoutError):
            process_control.wait_port_closed("127.0.0.1", port, 0.2)
    process_control.wait_port_closed("127.0.0.1", port, 5)

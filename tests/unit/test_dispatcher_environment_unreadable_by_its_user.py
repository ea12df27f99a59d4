"""Another process of the dispatcher's user cannot read a dispatcher process's environment.

The local drivers start servers (NVFLARE's server, Flower's SuperLink, the demo's sites) that
run users' job code as the dispatcher's own user (app/adapters/README.md "What a server
started on this host inherits"). Linux lets a process read /proc/<pid>/environ, open
/proc/<pid>/mem and ptrace another process of its user, unless that one is non-dumpable; a
worker's environment holds DATABASE_URL with its password, BROKER_URL, CALLBACK_SECRET,
API_SECRET and AWS keys. So every dispatcher process marks itself non-dumpable
(app/process_guard.py): the `fl-dispatcher` command (worker, beat, api, demo, ...) in its
main(), and every `celery -A app.celery_app` command when Celery imports the app.

The reading is real, by the kernel's rules: root reads anything, so the test forks a
stand-in dispatcher and a reader, both under an unprivileged uid, as the dispatcher and a
server it started are. Nothing is exec'd after the uid change (the interpreter may live
where that user cannot run it): everything used there is imported before the fork.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from app.process_guard import refuse_same_user_inspection

ROOT = Path(__file__).resolve().parents[2]
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
UNPRIVILEGED = 65534  # nobody: any uid without capabilities will do
READ_OK, REFUSED, OTHER_ERROR, CHILD_FAILED = 0, 13, 1, 70

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE and /proc are Linux's"
)


def _set_dumpable(flag: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    if libc.prctl(ctypes.c_int(PR_SET_DUMPABLE), ctypes.c_ulong(flag), zero, zero, zero) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def _become_unprivileged() -> None:
    os.setgroups([])
    os.setgid(UNPRIVILEGED)
    os.setuid(UNPRIVILEGED)
    # A uid change resets the flag to fs.suid_dumpable (0 here): set it back, as it is for a
    # process that user started in the ordinary way.
    _set_dumpable(1)


def _fork(body: Callable[[], int]) -> int:
    """The pid of a forked child that runs `body` and exits with what it returns."""
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = CHILD_FAILED
        try:
            code = body()
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _read_as_its_user(guarded: bool) -> tuple[bytes, dict[str, int]]:
    """Start a stand-in dispatcher under the unprivileged uid (calling the guard if
    `guarded`), then let a second process of that uid read its /proc files: what the
    dispatcher said of its guard, and each file's outcome (READ_OK, REFUSED, OTHER_ERROR)."""
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()

    def dispatcher() -> int:
        os.close(ready_r)
        os.close(release_w)
        _become_unprivileged()
        said = b"-"
        if guarded:
            said = b"1" if refuse_same_user_inspection() else b"0"
        os.write(ready_w, said)
        os.read(release_r, 1)  # until the test lets go (EOF)
        return 0

    dispatcher_pid = _fork(dispatcher)
    os.close(ready_w)
    os.close(release_r)
    outcomes: dict[str, int] = {}
    try:
        assert select.select([ready_r], [], [], 10)[0], "the stand-in dispatcher never started"
        said = os.read(ready_r, 1)
        for name in ("environ", "mem"):

            def reader(name: str = name) -> int:
                _become_unprivileged()
                try:
                    with open(f"/proc/{dispatcher_pid}/{name}", "rb") as file:
                        if name == "environ":
                            file.read()
                except PermissionError:
                    return REFUSED
                except OSError:
                    return OTHER_ERROR
                return READ_OK

            outcomes[name] = _exit_code(_fork(reader))
    finally:
        os.close(release_w)
        os.close(ready_r)
        dispatcher_exit = _exit_code(dispatcher_pid)
    assert dispatcher_exit == 0
    return said, outcomes


def _needs_root_and_linux() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_DUMPABLE and /proc are Linux's")
    if os.geteuid() != 0:
        pytest.skip("changing to another uid (the reader's and the dispatcher's) needs root")


def test_without_the_guard_a_process_of_the_same_user_reads_it():
    """The control: the setup can read, so a refusal below is the guard's."""
    _needs_root_and_linux()

    said, outcomes = _read_as_its_user(guarded=False)

    assert said == b"-"
    assert outcomes == {"environ": READ_OK, "mem": READ_OK}


def test_a_guarded_process_refuses_its_environ_and_memory_to_its_own_user():
    _needs_root_and_linux()

    said, outcomes = _read_as_its_user(guarded=True)

    assert outcomes == {"environ": REFUSED, "mem": REFUSED}
    assert said == b"1"  # the guard says it took


# Run in a fresh interpreter (exec makes a process dumpable again, whatever its parent was):
# the flag before and after, on the last line.
DUMPABLE = """
import ctypes
import logging
def dumpable():
    return ctypes.CDLL(None).prctl(ctypes.c_int(3), *(ctypes.c_ulong(0),) * 4)
"""

CLI = (
    DUMPABLE
    + """
import sys
from app.entrypoints.cli import main
before = dumpable()
code = main(["config", "check"])
print(code, before, dumpable())
"""
)

CELERY = (
    DUMPABLE
    + """
import sys
from celery.bin.celery import main
before = dumpable()
sys.argv = ["celery", "-A", "app.celery_app", "report"]
try:
    main()
except SystemExit as exc:
    code = exc.code
import os
child = os.fork()  # as a worker forks its pool processes and an embedded beat
if child == 0:
    os._exit(dumpable())
print(code, before, dumpable(), os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""
)

FLIP_CLIENT = (
    DUMPABLE
    + """
before = dumpable()
import app.client
print(0, before, dumpable())
"""
)


def _last_line(script: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FL_DISPATCHER_")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,  # the default data folder is relative: keep it out of the tree
        env=env | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@linux_only
def test_the_fl_dispatcher_command_makes_its_process_non_dumpable(tmp_path: Path):
    """main() covers every command: worker, beat, api, demo, housekeeper's."""
    assert _last_line(CLI, tmp_path) == "0 1 0"


@linux_only
def test_a_celery_command_on_the_app_makes_its_process_non_dumpable(tmp_path: Path):
    """`celery -A app.celery_app worker|beat|flower|...`: Celery imports the app first; a
    process it forks (the pool, an embedded beat) inherits the flag."""
    assert _last_line(CELERY, tmp_path) == "0 1 0 0"


@linux_only
def test_flip_apis_client_leaves_its_callers_process_as_it_was(tmp_path: Path):
    """app.client runs in flip-api's processes, which are not the dispatcher's to change."""
    assert _last_line(FLIP_CLIENT, tmp_path) == "0 1 1"


def test_elsewhere_than_linux_it_changes_nothing_and_says_so_at_debug(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setattr(sys, "platform", "darwin")

    with caplog.at_level(logging.DEBUG, logger="app.process_guard"):
        assert refuse_same_user_inspection() is False

    assert "not marked non-dumpable: darwin has no PR_SET_DUMPABLE" in caplog.text

"""Dispatcher processes closed to other processes of their own user.

The local drivers start servers that run users' job code as the dispatcher's user
(app/adapters/README.md "What a server started on this host inherits"). Linux lets a process
read /proc/<pid>/environ and /proc/<pid>/mem of another process of its user, and ptrace it,
unless that process is non-dumpable; a dispatcher's environment holds DATABASE_URL with its
password, BROKER_URL, CALLBACK_SECRET, API_SECRET and AWS keys.

Non-dumpable survives fork (Celery's pool processes, an embedded beat) and is reset by
execve, so the servers started here are ordinary processes. Its costs: no core dump, and a
debugger or profiler (gdb, py-spy) must run as root (with CAP_SYS_PTRACE) to attach.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

PR_SET_DUMPABLE = 4  # <linux/prctl.h>
SUID_DUMP_DISABLE = 0


def refuse_same_user_inspection() -> bool:
    """Mark this process non-dumpable, so no other process of its user (a server the local
    drivers started, running job code) reads its environment or memory; True if it took.
    Elsewhere than Linux, or if prctl fails, a debug line and False: nothing else changes."""
    if not sys.platform.startswith("linux"):
        log.debug("not marked non-dumpable: %s has no PR_SET_DUMPABLE", sys.platform)
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter runs on
        # prctl is variadic and reads unsigned longs: pass them at that width.
        zero = ctypes.c_ulong(0)
        result = libc.prctl(
            ctypes.c_int(PR_SET_DUMPABLE), ctypes.c_ulong(SUID_DUMP_DISABLE), zero, zero, zero
        )
    except (OSError, AttributeError) as exc:  # no C library, or one without prctl
        log.debug("not marked non-dumpable: %s", exc)
        return False
    if result != 0:
        log.debug("not marked non-dumpable: prctl failed, errno %s", ctypes.get_errno())
        return False
    return True

"""Celery's prefork pool with one fix: the locks its processes share are released by the
kernel when a process holding one dies. Selected by `celery_config` (`worker_pool`).

Why (measured with celery 5.7.0, billiard 4.3.2, kombu 5.7.0; the e2e test
`test_a_worker_whose_idle_pool_processes_are_killed_goes_on_consuming`): Celery runs its
prefork pool under the worker's event loop (one pipe per pool process) only for a transport
that joins that loop (Redis, AMQP). kombu's SQLAlchemy transport, the embedded default,
cannot, so the worker runs billiard's plain pool instead: ONE task pipe shared by every pool
process, read under one process-shared lock (a POSIX semaphore, `SimpleQueue._rlock`), and one
result pipe written under another (`_wlock`). An idle pool process waits for its next task
INSIDE the read lock (`SimpleQueue.get_payload`: `with self._rlock: recv_bytes()`). SIGKILLed
there (the OOM killer, a kill -9) it never releases it: billiard starts a replacement, which
waits for the lock for ever, as do the other pool processes. The worker lives on, takes up to
`concurrency` messages from the broker table (prefetch) into a pool that never runs them, and
every later message stays in the table; its warm shutdown hangs as well (`Pool.terminate`
takes the same lock). Nothing in billiard can tell whether a dead process held the lock
(celery/billiard#104, celery/celery#2369; CPython's multiprocessing.Pool has the same flaw,
python/cpython#96062). A pool process killed while RUNNING a task holds neither lock: that
case already recovers (`reject_on_worker_lost` puts its message back after
`worker_lost_wait`, 10 s).

So here both locks are `flock` locks on files of the pool's own: a process dying while it
holds one closes its file, which releases the lock. With Redis the worker never uses this
pool (the event loop's pool has no shared lock), so the class is the same for every broker.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from billiard.pool import Pool as BilliardPool
from celery.concurrency import prefork

# What `worker_pool` names (Celery resolves a dotted path there, as for `--pool`).
POOL_PATH = "app.worker_pool:TaskPool"


class ReleasedOnDeathLock:
    """A lock shared by the processes of one pool: an exclusive `flock` on a file, which each
    process opens for itself (a lock belongs to an open file: one inherited through the fork
    would be held by parent and child at once), and a thread lock for the threads of one
    process (a flock does not exclude two threads sharing the file). A process that dies
    holding it closes the file, and the kernel releases the lock."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pid = -1
        self._fd = -1
        self._threads = threading.Lock()
        # Opened at once: the pool's parent, which removes the folder at its exit, still takes
        # the lock after that (billiard's exit finalizer, `Pool._help_stuff_finish`).
        self._file()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}  # a spawned pool process opens the file for itself

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def _file(self) -> int:
        if self._pid != os.getpid():
            # First use in this process (a forked child starts with its parent's state): its
            # own open file, and a thread lock no thread of its parent may have held at the fork.
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._threads = threading.Lock()
            self._pid = os.getpid()
        return self._fd

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Take the lock (as `multiprocessing.Lock.acquire`): True once taken, False if it was
        not free (not blocking) or not freed within `timeout` seconds."""
        fd = self._file()
        wait = timeout if block and timeout is not None else None
        if not self._threads.acquire(block, -1 if wait is None else max(wait, 0.0)):
            return False
        try:
            if block and wait is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return True
            deadline = time.monotonic() + (wait or 0.0)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    if not block or time.monotonic() >= deadline:
                        break
                    time.sleep(0.01)
        except BaseException:
            self._threads.release()
            raise
        self._threads.release()
        return False

    def release(self) -> None:
        """Give the lock back."""
        fcntl.flock(self._file(), fcntl.LOCK_UN)
        self._threads.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()


class BlockingPool(BilliardPool):  # type: ignore[misc]
    """billiard's pool (what Celery runs without an event loop) whose pool processes take
    `ReleasedOnDeathLock`s around the shared pipes: the task pipe's read lock, which an idle
    process holds while it waits, and the result pipe's write lock. The parent process reads
    results and writes tasks without either."""

    def _setup_queues(self) -> None:
        super()._setup_queues()
        folder = tempfile.mkdtemp(prefix="fl-dispatcher-pool-")
        self._inqueue._rlock = ReleasedOnDeathLock(os.path.join(folder, "tasks.lock"))
        self._outqueue._wlock = ReleasedOnDeathLock(os.path.join(folder, "results.lock"))
        owner = os.getpid()

        def remove() -> None:
            if os.getpid() == owner:  # never from a pool process
                shutil.rmtree(folder, ignore_errors=True)

        atexit.register(remove)  # the files stay open in the processes that opened them


class TaskPool(prefork.TaskPool):  # type: ignore[misc]
    """Celery's prefork pool; without an event loop it runs `BlockingPool`."""

    BlockingPool = BlockingPool

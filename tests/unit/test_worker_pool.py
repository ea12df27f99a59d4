"""The pool's shared locks (app/worker_pool.py): a process SIGKILLed while holding one leaves
it free for the others; billiard's own lock stays taken for ever. The whole worker's case is
tests/e2e/test_embedded_queues.py's `test_a_worker_whose_idle_pool_processes_are_killed...`."""

from __future__ import annotations

import os
import signal
import time

import billiard
from billiard.pool import Pool as BilliardPool
from celery.concurrency import get_implementation

from app.worker_pool import POOL_PATH, BlockingPool, ReleasedOnDeathLock, TaskPool


def _hold_and_wait(lock, taken) -> None:
    with lock:
        taken.set()
        time.sleep(60)  # killed before this ends


def _killed_while_holding(lock) -> None:
    """Fork a process that takes `lock`, SIGKILL it while it holds it."""
    ctx = billiard.get_context("fork")
    taken = ctx.Event()
    holder = ctx.Process(target=_hold_and_wait, args=(lock, taken))
    holder.start()
    assert taken.wait(10)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)


def test_a_lock_its_holder_took_to_its_death_is_free_again(tmp_path):
    lock = ReleasedOnDeathLock(str(tmp_path / "tasks.lock"))
    _killed_while_holding(lock)
    assert lock.acquire(timeout=5)
    lock.release()


def test_billiards_own_lock_stays_taken_when_its_holder_is_killed():
    # What the pool shared before (`SimpleQueue._rlock`): the reason for the class above.
    lock = billiard.get_context("fork").Lock()
    _killed_while_holding(lock)
    assert not lock.acquire(timeout=0.5)


def test_two_processes_never_hold_the_lock_at_once(tmp_path):
    lock = ReleasedOnDeathLock(str(tmp_path / "tasks.lock"))
    ctx = billiard.get_context("fork")
    taken = ctx.Event()
    holder = ctx.Process(target=_hold_and_wait, args=(lock, taken))
    holder.start()
    try:
        assert taken.wait(10)
        assert not lock.acquire(block=False)
        assert not lock.acquire(timeout=0.3)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
    assert lock.acquire(block=False)
    lock.release()


def test_the_threads_of_one_process_take_it_in_turn(tmp_path):
    # One open file per process: flock alone would let two threads in at once.
    lock = ReleasedOnDeathLock(str(tmp_path / "tasks.lock"))
    assert lock.acquire()
    try:
        assert not lock.acquire(timeout=0.2)
    finally:
        lock.release()


def test_celery_runs_the_pool_whose_shared_locks_are_released_on_death(tmp_path):
    assert get_implementation(POOL_PATH) is TaskPool
    assert TaskPool.BlockingPool is BlockingPool
    pool = BlockingPool(processes=1)
    try:
        assert isinstance(pool._inqueue._rlock, ReleasedOnDeathLock)
        assert isinstance(pool._outqueue._wlock, ReleasedOnDeathLock)
        assert pool.apply_async(pow, (2, 5)).get(timeout=30) == 32
    finally:
        pool.terminate()
        pool.join()
    assert issubclass(BlockingPool, BilliardPool)


def test_a_child_forked_while_its_parent_holds_the_lock_does_not_hold_it_too(tmp_path):
    # An open file inherited through the fork would share the parent's flock: each process
    # opens its own, and gets a thread lock of its own (the parent's was taken at the fork).
    lock = ReleasedOnDeathLock(str(tmp_path / "tasks.lock"))
    assert lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            os._exit(0 if not lock.acquire(block=False) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        lock.release()

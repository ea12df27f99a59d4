"""Calls run in parallel processes (forked: the simulator's state is not pickled back and
forth, only each call's argument and result), their results in the order asked, each
reported as it ends: `fl-dispatcher simulate`'s replays take minutes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def _numbered(call: Callable[[T], R], numbered: tuple[int, T]) -> tuple[int, R]:
    return numbered[0], call(numbered[1])


def in_processes(
    call: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    done: Callable[[int, int, R], None] | None = None,
) -> list[R]:
    """`[call(item) for item in items]`, `workers` at a time in forked processes (in this
    one for a single worker or item); `done(count, index, result)` as each ends, in the
    order they end. `call` must be a module's function (it is pickled by name)."""
    numbered = list(enumerate(items))
    results: dict[int, R] = {}

    def collect(finished: Iterator[tuple[int, R]]) -> None:
        for index, result in finished:
            results[index] = result
            if done is not None:
                done(len(results), index, result)

    if workers > 1 and len(items) > 1:
        with multiprocessing.get_context("fork").Pool(min(workers, len(items))) as pool:
            collect(pool.imap_unordered(partial(_numbered, call), numbered, chunksize=1))
            # Let the workers end on their own (the `with` would kill them): their exit
            # runs multiprocessing's finalizers, which remove their scratch folders.
            pool.close()
            pool.join()
    else:
        collect(_numbered(call, pair) for pair in numbered)
    return [results[i] for i in range(len(items))]

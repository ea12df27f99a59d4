"""Run many seeds, in parallel worker processes if asked (each seed is a deterministic,
single-threaded simulation of its own; processes only share the work out)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable, Iterator

from app.sim.faults import FaultProfile
from app.sim.report import Result
from tests.sim.seeds import run_seed

DEFAULT_SEEDS = 200


def seed_count() -> int:
    """SIM_SEEDS (how many seeds the sweep runs), default DEFAULT_SEEDS."""
    return int(os.environ.get("SIM_SEEDS", DEFAULT_SEEDS))


def worker_count() -> int:
    """SIM_WORKERS, default: every core (at most 4)."""
    default = min(4, os.cpu_count() or 1)
    return max(1, int(os.environ.get("SIM_WORKERS", default)))


def _one(args: tuple[int, FaultProfile | None, bool]) -> Result:
    seed, profile, fail_fast = args
    return run_seed(seed, profile, fail_fast=fail_fast)


def run_seeds(
    seeds: Iterable[int],
    profile: FaultProfile | None = None,
    workers: int | None = None,
    *,
    fail_fast: bool = False,
) -> Iterator[Result]:
    """Results as they come (order not guaranteed with several workers)."""
    todo = [(seed, profile, fail_fast) for seed in seeds]
    workers = worker_count() if workers is None else workers
    if workers <= 1 or len(todo) < 8:
        for item in todo:
            yield _one(item)
        return
    context = multiprocessing.get_context("fork")
    with context.Pool(workers) as pool:
        yield from pool.imap_unordered(_one, todo, chunksize=4)
        # Workers that end on their own (the `with` kills them) remove their scratch
        # folders (app.sim.db.scratch_dir); one stopped early is killed as before.
        pool.close()
        pool.join()

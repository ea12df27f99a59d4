"""Benchmark (not a test): what one seed of the simulator's sweep costs, and how far the long
sweep (`python -m tests.sim sweep --seeds 10000 --workers 2`) is from its goal.

    .venv/bin/python -m tests.bench.bench_sweep [--seeds 200] [--start 0] [--workers 2] [--json]

Runs seeds START..START+N-1 as the sweep does (every profile by seed, every invariant after
every step), in WORKERS forked processes, and reports each seed's CPU time (measured in the
process that ran it), the wall time, and the 10,000-seed sweep's wall time projected from
this run's (wall / N x 10,000). Goal: the 10,000-seed sweep in under 10 minutes on two cores.
The load average says how much the machine was shared meanwhile.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time

from app.sim.db import template_db
from tests.bench.common import common_args, environment, print_table, ratio
from tests.sim.seeds import run_seed

GOAL_SEEDS = 10_000
GOAL_S = 600.0


def _one(seed: int) -> tuple[int, float, int, str]:
    """(seed, CPU seconds, violations, profile) of one seed, run where it is measured."""
    started = time.process_time()
    result = run_seed(seed)
    return seed, time.process_time() - started, len(result.violations), result.profile


def main() -> None:
    """Run the benchmark and print its table (or JSON)."""
    parser = common_args(argparse.ArgumentParser())
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    template_db()  # built once before forking, as the sweep's workers inherit it
    seeds = list(range(args.start, args.start + args.seeds))
    load_before = os.getloadavg()[0]
    wall = time.perf_counter()
    if args.workers <= 1:
        rows = [_one(seed) for seed in seeds]
    else:
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            rows = list(pool.imap_unordered(_one, seeds, chunksize=4))
    wall_s = time.perf_counter() - wall
    load_after = os.getloadavg()[0]

    cpu = sorted(r[1] for r in rows)
    projected = wall_s / len(seeds) * GOAL_SEEDS
    by_profile: dict[str, list[float]] = {}
    for _, spent, _, profile in rows:
        by_profile.setdefault(profile, []).append(spent)
    figures = {
        "seeds": f"{args.start}:{args.start + args.seeds}",
        "workers": args.workers,
        "wall_s": round(wall_s, 1),
        "cpu_per_seed_mean_s": round(statistics.fmean(cpu), 3),
        "cpu_per_seed_median_s": round(statistics.median(cpu), 3),
        "cpu_per_seed_p95_s": round(cpu[int(0.95 * (len(cpu) - 1))], 3),
        "cpu_per_seed_max_s": round(cpu[-1], 3),
        "cpu_by_profile_s": {
            p: round(statistics.fmean(v), 3) for p, v in sorted(by_profile.items())
        },
        "projected_10000_wall_s": round(projected, 1),
        "ratio_to_goal": round(projected / GOAL_S, 2),
        "seeds_with_violations": sorted(r[0] for r in rows if r[2]),
        "load_average": [round(load_before, 2), round(load_after, 2)],
        "environment": environment(),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print_table(
        f"simulator sweep, seeds {figures['seeds']}, {args.workers} workers (load average"
        f" {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs)",
        ["what", "figure", "goal", "figure / goal"],
        [
            ("CPU per seed, mean (s)", figures["cpu_per_seed_mean_s"], "", ""),
            (
                "CPU per seed, median / p95 / max (s)",
                f"{figures['cpu_per_seed_median_s']} / {figures['cpu_per_seed_p95_s']}"
                f" / {figures['cpu_per_seed_max_s']}",
                "",
                "",
            ),
            (f"wall, {len(seeds)} seeds (s)", wall_s, "", ""),
            (
                f"{GOAL_SEEDS:,} seeds, projected wall (s)",
                projected,
                GOAL_S,
                ratio(projected, GOAL_S),
            ),
        ],
    )
    print("CPU per seed by profile (s):", figures["cpu_by_profile_s"])
    print("seeds with violations:", figures["seeds_with_violations"] or "none")


if __name__ == "__main__":
    main()

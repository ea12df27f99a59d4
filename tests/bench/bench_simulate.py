"""Benchmark (not a test): how long `fl-dispatcher simulate` takes on a month at FLIP's scale.

    .venv/bin/python -m tests.bench.bench_simulate [--days 30] [--grace 300] [--json] [--cprofile]

The default synthetic trace (seed 0: 4 nets, about 1,000 jobs in 30 days, 23% busy) is
replayed once at one grace (the figure the goal is about: one simulated month), then the
whole command runs as an operator would (every default grace plus the always-on replay,
two at a time). Wall and CPU time; the load average says how much the machine was shared.
Goal: one simulated month in under 30 s.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time

from app.sim import savings
from app.sim.db import template_db
from app.sim.trace import Synthetic, synthesize
from tests.bench.common import common_args, environment, print_table, ratio

GOAL_S = 30.0


def main() -> None:
    """Run the benchmark and print its table (or JSON)."""
    parser = common_args(argparse.ArgumentParser())
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--grace", type=float, default=300.0, help="the single replay's grace")
    parser.add_argument("--cprofile", action="store_true", help="profile the single replay")
    args = parser.parse_args()

    template_db()  # the migrated template every replay copies: built once, not measured
    trace = synthesize(Synthetic(days=args.days))
    nets = [f"net-{i}" for i in range(1, 5)]
    load_before = os.getloadavg()[0]

    profiler = cProfile.Profile() if args.cprofile else None
    cpu, wall = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    one = savings.replay(trace, nets, args.grace, savings.LOCAL)
    if profiler is not None:
        profiler.disable()
    one_wall, one_cpu = time.perf_counter() - wall, time.process_time() - cpu

    wall = time.perf_counter()
    report = savings.simulate(trace, nets, savings.DEFAULT_GRACES, savings.LOCAL, workers=2)
    all_wall = time.perf_counter() - wall
    load_after = os.getloadavg()[0]

    figures = {
        "jobs": len(trace.jobs),
        "days": args.days,
        "one_month_wall_s": round(one_wall, 2),
        "one_month_cpu_s": round(one_cpu, 2),
        "one_month_ratio": round(one_wall / GOAL_S, 3),
        "whole_command_wall_s": round(all_wall, 2),
        "replays": len(report.results) + 1,
        "load_average": [round(load_before, 2), round(load_after, 2)],
        "unfinished": one.unfinished,
        "environment": environment(),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_table(
            f"fl-dispatcher simulate: {len(trace.jobs)} jobs, 4 nets, {args.days:g} days"
            f" (load average {load_before:.1f} before, {load_after:.1f} after, on"
            f" {os.cpu_count()} CPUs)",
            ["what", "wall s", "CPU s", "goal s", "wall / goal"],
            [
                (
                    f"one simulated month (grace {args.grace:g} s)",
                    one_wall,
                    one_cpu,
                    GOAL_S,
                    ratio(one_wall, GOAL_S),
                ),
                (
                    f"whole command ({figures['replays']} replays, 2 at a time)",
                    all_wall,
                    "",
                    "",
                    "",
                ),
            ],
        )
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(r"(app|models)/", 25)


if __name__ == "__main__":
    main()

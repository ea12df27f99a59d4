"""A burst of enqueues, as flip-api sends them, against a real worker and beat: the intake
rate, how long the public queue takes to drain, how many assign kicks the burst caused, and
how late beat's housekeeping ran meanwhile (tests/README.md "Performance", issue 20).

    .venv/bin/python -m tests.bench.bench_burst [--jobs 20000] [--interval 2] \
        [--layout split|one] [--ceiling] [--keep] [--json]

A private redis-server, a fresh PostgreSQL database, the real processes (`fl-dispatcher
worker` per `--layout`, `fl-dispatcher beat`) and the production defaults except
HOUSEKEEPING_INTERVAL_S (`--interval`: a shorter one gives more beat messages to measure
during the drain, and a tighter bound). The nets take no job (tests/fixtures/burst.py), so
only the dispatcher's own queues are measured. Goal: every beat task starts within one
HOUSEKEEPING_INTERVAL_S of being sent (the ratio is the worst lateness over the interval;
a message that did not start within it, expired or still queued, is counted as late).

Intake (issue 37): goal 1,000 enqueues/s into rows. The workers' CPU per enqueue is printed
beside it (robust to a busy machine, where the rate is not), and `--ceiling` first runs the
same burst against a worker with the same Celery configuration whose enqueue task does
nothing (tests/bench/noop_worker.py): Celery's own rate on this machine, which bounds ours.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.common import environment, print_table
from tests.fixtures.burst import LAYOUTS, Layout, burst_stack, settle

# Issue 37's goal: enqueues stored as rows per second, on PostgreSQL.
INTAKE_GOAL_PER_S = 1_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--interval", type=float, default=2.0, help="HOUSEKEEPING_INTERVAL_S")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="split")
    parser.add_argument("--nets", type=int, default=4)
    parser.add_argument(
        "--drain-cap",
        type=float,
        default=300.0,
        help="after every job is stored, wait at most this long for the queue to empty (s)",
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also measure Celery alone: the same burst to a no-op enqueue task",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # A plain SIGTERM would skip the cleanup below (workers, beat and Redis left running).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    layout = LAYOUTS[args.layout]
    ceiling = _ceiling(layout, args) if args.ceiling else None
    workdir = Path(tempfile.mkdtemp(prefix="fld-bench-burst-"))
    load_before = os.getloadavg()[0]
    with burst_stack(workdir, layout, args.interval, args.nets, keep=args.keep) as (stack, events):
        time.sleep(args.interval * 2)  # beat's first ticks, before the burst
        cpu_before = stack.worker_cpu_s()
        burst = stack.burst(
            args.jobs, timeout_s=max(600.0, args.jobs / 5), drain_cap_s=args.drain_cap
        )
        worker_cpu_ms = (stack.worker_cpu_s() - cpu_before) / args.jobs * 1000
        settle(burst.end, args.interval)
        beat = events.lateness(burst.send_start, burst.end, args.interval)
        kicks = events.kicks(burst.send_start, burst.end)
    load_after = os.getloadavg()[0]

    every = [s for entry in beat.values() for s in entry.started_s]
    late = sum(entry.late for entry in beat.values())
    worst = max(every, default=float("nan"))
    result = {
        "env": environment(),
        "layout": layout.name,
        "jobs": args.jobs,
        "interval_s": args.interval,
        "send_rate_per_s": round(burst.send_rate, 1),
        "intake_rate_per_s": round(burst.intake_rate, 1),
        "intake_goal_ratio": round(burst.intake_rate / INTAKE_GOAL_PER_S, 3),
        "worker_cpu_ms_per_enqueue": round(worker_cpu_ms, 2),
        "celery_ceiling": ceiling,
        "all_stored_s": round(burst.stored_s, 2),
        "drain_s": round(burst.drain_s, 2),
        "drained": burst.drained is not None,
        "left_on_queue": burst.left,
        "assign_kicks": kicks,
        "beat": {
            name.rsplit(".", 1)[-1]: {
                "sent": entry.sent,
                "ran": len(entry.started_s),
                "expired": entry.expired,
                "unrun": entry.unrun,
                "late": entry.late,
                "max_s": round(entry.max_s, 3),
                "p95_s": round(entry.p95_s, 3),
            }
            for name, entry in beat.items()
        },
        "worst_lateness_s": round(worst, 3),
        "beat_late": late,
        "ratio": f"{late} late" if late else f"{worst / args.interval:.2f}x",
        "load_average": [round(load_before, 1), round(load_after, 1)],
    }
    if args.keep:
        result["workdir"] = str(workdir)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"burst of {args.jobs:,} enqueues, {layout.name}, HOUSEKEEPING_INTERVAL_S "
        f"{args.interval:g} s (load average {load_before:.1f} before, {load_after:.1f} after, "
        f"on {os.cpu_count()} CPUs)"
    )
    drained = (
        f"queue drained in {burst.drain_s:.1f} s"
        if burst.drained is not None
        else f"queue NOT drained after {burst.drain_s:.1f} s ({burst.left:,} messages left)"
    )
    print(
        f"  sent at {burst.send_rate:,.0f}/s; intake {burst.intake_rate:,.1f} jobs/s (all "
        f"stored after {burst.stored_s:.1f} s); {drained}; {kicks:,} assign kicks"
    )
    print(
        f"  intake against the goal ({INTAKE_GOAL_PER_S:,}/s): "
        f"{burst.intake_rate / INTAKE_GOAL_PER_S:.2f}x; workers' CPU "
        f"{worker_cpu_ms:.2f} ms per enqueue (every task the burst caused, beat's included)"
    )
    if ceiling is not None:
        print(
            f"  Celery alone (no-op enqueue task, same configuration): "
            f"{ceiling['rate_per_s']:,.1f} messages/s, {ceiling['worker_cpu_ms']:.2f} ms CPU "
            f"each; intake is {burst.intake_rate / ceiling['rate_per_s']:.2f}x of it, the goal "
            f"{INTAKE_GOAL_PER_S / ceiling['rate_per_s']:.2f}x"
        )
    rows = [
        [
            name.rsplit(".", 1)[-1],
            entry.sent,
            len(entry.started_s),
            entry.expired,
            entry.unrun,
            entry.late,
            f"{entry.max_s:.3f}",
            f"{entry.p95_s:.3f}",
        ]
        for name, entry in beat.items()
    ]
    print_table(
        "beat messages sent during the drain (lateness: send to start, s)",
        ["task", "sent", "ran", "expired", "unrun", "late", "max s", "p95 s"],
        rows,
    )
    verdict = (
        f"{late} beat message(s) did not start within {args.interval:g} s"
        if late
        else f"worst {worst:.3f} s = {worst / args.interval:.2f}x the goal ({args.interval:g} s)"
    )
    print(f"beat lateness against one interval: {verdict}")
    if args.keep:
        print(f"work folder (logs): {workdir}")


def _ceiling(layout: Layout, args: argparse.Namespace) -> dict[str, float]:
    """The same burst to workers whose enqueue task does nothing: Celery's own rate here."""
    workdir = Path(tempfile.mkdtemp(prefix="fld-bench-ceiling-"))
    with burst_stack(workdir, layout, args.interval, args.nets, noop=True) as (stack, _events):
        cpu_before = stack.worker_cpu_s()
        burst = stack.burst(
            args.jobs, timeout_s=max(600.0, args.jobs / 5), drain_cap_s=args.drain_cap
        )
        cpu_ms = (stack.worker_cpu_s() - cpu_before) / args.jobs * 1000
    return {"rate_per_s": round(burst.intake_rate, 1), "worker_cpu_ms": round(cpu_ms, 2)}


if __name__ == "__main__":
    main()

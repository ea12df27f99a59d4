"""Benchmark (not a test): the cold start of this repository's local NVFLARE 2.9 server, the
figures `fl-dispatcher simulate`'s default `local` cold-start profile uses.

    .venv/bin/python -m tests.bench.bench_cold_start [--reps 3] [--down 10] [--json]

Provisions a deployment (server, site-1, site-2) into a temporary folder, starts it once
with its sites, then per cycle: stops the server (the sites keep running, as they do while
a net is scaled to zero), waits `--down` seconds, starts it again and measures the process
start to the first fresh admin login (`login`), then the login to every site registered
again (`sites`), and how long the stop took (`stop`). Medians and means over the cycles
(a site re-registers on its own retry timer, so `sites` varies from cycle to cycle).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from app.local import nvflare as nvflare_local
from tests.bench.common import common_args, environment, print_table
from tests.fixtures.nvflare import NvflareSystem


def main() -> None:
    """Run the cycles and print the figures."""
    parser = common_args(argparse.ArgumentParser())
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--down", type=float, default=10.0, help="seconds the server stays down")
    args = parser.parse_args()
    cycles: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="fld-cold-") as tmp:
        system = NvflareSystem(nvflare_local.provision(Path(tmp) / "nvflare"))
        try:
            system.ensure_sites()
            for _ in range(args.reps):
                started = time.monotonic()
                system.stop_server()
                stop_s = time.monotonic() - started
                time.sleep(args.down)
                started = time.monotonic()
                system.start_server()
                system.wait_login()
                login_s = time.monotonic() - started
                sites_s = system.wait_sites()
                cycles.append({"stop_s": stop_s, "login_s": login_s, "sites_s": sites_s})
        finally:
            system.close()
    medians = {k: round(statistics.median(c[k] for c in cycles), 2) for k in cycles[0]}
    means = {k: round(statistics.fmean(c[k] for c in cycles), 2) for k in cycles[0]}
    if args.json:
        print(
            json.dumps(
                {"median": medians, "mean": means, "cycles": cycles, "environment": environment()},
                indent=2,
            )
        )
        return
    print_table(
        f"local NVFLARE cold start ({args.reps} cycles, server down {args.down:g} s each)",
        ["cycle", "login s", "sites s", "login + sites s", "stop s"],
        [
            *(
                (str(i + 1), c["login_s"], c["sites_s"], c["login_s"] + c["sites_s"], c["stop_s"])
                for i, c in enumerate(cycles)
            ),
            *(
                (name, f["login_s"], f["sites_s"], f["login_s"] + f["sites_s"], f["stop_s"])
                for name, f in (("median", medians), ("mean", means))
            ),
        ],
    )


if __name__ == "__main__":
    main()

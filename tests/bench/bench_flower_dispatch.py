"""Benchmark (not a test): enqueue -> RUNNING on a Flower net, cold and warm, beside the
stock `flwr run` on an always-on SuperLink (issue 38).

    .venv/bin/python -m tests.bench.bench_flower_dispatch [--reps 3] [--sqlite] [--json]

Real parts only, as bench_cold_dispatch and bench_warm_dispatch (a private Redis, a real
Celery worker and a separate beat, PostgreSQL in a fresh database or SQLite), with a Flower
net in place of the NVFLARE one: the local driver's SuperLink (flwr 1.42 from its own
virtualenv, TLS, SuperNode authentication, its state in a database) and two SuperNodes that
run throughout (app/local/flower.py, as `demo --backend flower`). Each repetition runs a cold
job (the net STOPPED, its SuperLink process gone) and, as soon as that one completed, a warm
one (the net READY within its idle grace); each waits out its run before the next.

The reference, first, on the same SuperLink and SuperNodes before the dispatcher starts: the
SuperLink started and left up (always-on, the deployment the dispatcher replaces), and the
stock `flwr run APP CONNECTION` (flwr's own CLI, which builds the FAB itself) timed from its
start to its exit with the run's id; each run is waited out too. No goal is set: the figures
sit beside the NVFLARE ones in tests/README.md "Performance".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from app.local.flower import build_flower_app, ensure_flower_venv, local_flower_net, poll
from app.local.stack import LocalStack
from models import JobState, NetState
from tests.bench.common import environment, print_table
from tests.bench.dispatch_stack import Series, dispatch_stack, moves, ms, stack_args, wait_job

NET = "flower-bench"
APP = "bench-flower-app"
IDLE_S = 10  # long enough to enqueue the warm job while the net is READY
HOPS = ("ASSIGNED", "DISPATCHING", "RUNNING")
RUN_S = 300.0


def wait_net(stack: LocalStack, state: NetState, *, up: bool) -> None:
    def reached() -> bool:
        return stack.net(NET).state == state and stack.driver(NET).observe().is_up == up

    stack.wait_for(f"net {NET} {state}", reached, RUN_S, poll_s=0.1)


def dispatched(stack: LocalStack, key: str) -> dict[str, float]:
    """Enqueue the app on the net; ms from the send to each move; wait the run out."""
    sent = time.time()
    job_id = stack.enqueue(key, definition=APP, net=NET)
    wait_job(stack, job_id, JobState.RUNNING, JobState.FINISHING, JobState.COMPLETED)
    at = moves(stack, job_id)
    wait_job(stack, job_id, JobState.COMPLETED, poll_s=0.2)
    return {hop: ms(at[hop] - sent) for hop in HOPS}


class Stock:
    """flwr's own CLI on the net's SuperLink, left up: `flwr run` per job."""

    def __init__(self, root: Path, venv: Path, entry: dict[str, Any]) -> None:
        self.venv = venv
        self.app = root / "jobs" / APP
        self.home = root / "flwr-cli"
        self.home.mkdir(parents=True, exist_ok=True)
        flower = entry["flower"]
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
            f'address = "{flower["address"]}"\n'
            f'root-certificates = "{flower["root_certificates"]}"\n'
        )
        self.env = dict(os.environ, FLWR_HOME=str(self.home))
        self.env["PATH"] = f"{venv / 'bin'}{os.pathsep}{self.env['PATH']}"
        self.env.pop("PYTHONPATH", None)

    def run_ms(self, client: Any) -> float:
        """One `flwr run` (timed to its exit with the run id), then the run waited out."""
        start = time.perf_counter()
        done = subprocess.run(
            [str(self.venv / "bin" / "flwr"), "run", str(self.app), "bench", "--format", "json"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=RUN_S,
        )
        elapsed = time.perf_counter() - start
        answer = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
        if done.returncode != 0 or not answer.get("run-id"):
            raise RuntimeError(f"flwr run: {done.returncode} {done.stdout} {done.stderr}")
        from app.adapters.backend import RunState

        run_id = str(answer["run-id"])
        status = poll(
            f"stock run {run_id} over",
            lambda: (s := client.job_status(run_id)).state is not RunState.RUNNING and s,
            RUN_S,
            0.5,
        )
        if status.state is not RunState.COMPLETED:
            raise RuntimeError(f"stock run {run_id}: {status}")
        return ms(elapsed)


def main() -> None:
    parser = stack_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]), reps=3)
    args = parser.parse_args()
    venv = ensure_flower_venv()
    stock: list[float] = []

    def before(root: Path, exits: ExitStack) -> dict[str, Any]:
        from app.adapters.drivers import build_driver
        from app.adapters.flower.client import build_flower_client
        from app.settings import Settings

        entry, nodes = local_flower_net(root, venv, name=NET, idle_timeout_s=IDLE_S)
        exits.callback(nodes.close)
        build_flower_app(root / "jobs" / APP)
        settings = Settings(
            NETS=json.dumps([entry]), FLWR_VENV=str(venv), FL_DISPATCHER_DATA_DIR=str(root / "data")
        )
        net = settings.net(NET)
        driver = build_driver(net, settings)
        driver.scale(1)  # always-on, for the stock runs only
        try:
            reference = Stock(root, venv, entry)
            with build_flower_client(net, settings) as client:
                poll("SuperNodes online", lambda: client.is_ready(nodes.sites).ready, 120, 0.5)
                reference.run_ms(client)  # unmeasured: the CLI's first imports
                stock.extend(reference.run_ms(client) for _ in range(args.reps))
        finally:
            driver.scale(0)
        return {"nvflare": False, "extra_nets": [entry], "flwr_venv": venv}

    cold: list[dict[str, float]] = []
    warm: list[dict[str, float]] = []
    with dispatch_stack(
        args, idle_timeout_s=IDLE_S, housekeeping_interval_s=1.0, before=before
    ) as stack:
        wait_net(stack, NetState.STOPPED, up=False)
        dispatched(stack, "bench-flower-warm-up")  # a worker's first tasks pay its imports
        for rep in range(args.reps):
            wait_net(stack, NetState.STOPPED, up=False)
            cold.append(dispatched(stack, f"bench-flower-cold-{rep}"))
            warm.append(dispatched(stack, f"bench-flower-warm-{rep}"))

    cold_running = Series([r["RUNNING"] for r in cold])
    warm_running = Series([r["RUNNING"] for r in warm])
    flwr_run = Series(stock)
    result = {
        "environment": environment(),
        "database": "sqlite" if args.sqlite else "postgresql",
        "reps": args.reps,
        "cold": cold,
        "warm": warm,
        "stock_flwr_run_ms": stock,
        "cold_enqueue_to_running_ms": {"median": cold_running.median, "max": cold_running.max},
        "warm_enqueue_to_running_ms": {"median": warm_running.median, "max": warm_running.max},
        "stock_flwr_run_to_run_id_ms": {"median": flwr_run.median, "max": flwr_run.max},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print_table(
        "Flower net, ms after the enqueue was sent (each repetition); stock: `flwr run` to its "
        "run id",
        ["rep", *(f"cold -> {h}" for h in HOPS), *(f"warm -> {h}" for h in HOPS), "stock"],
        [
            [i + 1, *(c[h] for h in HOPS), *(w[h] for h in HOPS), s]
            for i, (c, w, s) in enumerate(zip(cold, warm, stock, strict=True))
        ],
    )
    print()
    print_table(
        "Flower net: enqueue -> RUNNING against the stock `flwr run` on an always-on SuperLink",
        ["figure", "median ms", "max ms"],
        [
            ["cold enqueue -> RUNNING (SuperLink at zero)", cold_running.median, cold_running.max],
            ["warm enqueue -> RUNNING (net READY)", warm_running.median, warm_running.max],
            ["stock `flwr run` -> run id (always-on)", flwr_run.median, flwr_run.max],
        ],
    )


if __name__ == "__main__":
    main()

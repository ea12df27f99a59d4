"""Reproducer: restart Redis (no persistence) under a worker holding an unacked message.

    .venv/bin/python -m tests.tools.redis_restart_repro [--mode eta|sleep] [--rounds N] [--stock]

Starts a private redis-server on a free loopback port and this project's worker
(`app.celery_app.run_worker`: the project's Celery configuration) with one extra late-ack
task, `repro.hold`. It sends a task whose message the worker keeps unacknowledged (`eta`: a
countdown the worker holds, as `wait_ready` does between polls; `sleep`: a task still
running), SIGKILLs and restarts Redis, then checks that the worker is alive and consumes a
task sent after the restart. `--stock` runs kombu's own Redis transport instead of
`app.redis_transport` (with celery 5.7.0 / kombu 5.7.0 the worker then dies with
AttributeError: 'NoneType' object has no attribute 'hostname').

Exit status 0: the worker survived every round; 1: it died or stopped consuming.
Nothing here touches the machine's shared Redis or PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.services import PrivateRedis

REPO = Path(__file__).resolve().parents[2]
HOLD = "repro.hold"


def worker_main(stock: bool) -> None:
    """The worker process: the project's worker plus one task that holds its message."""
    from celery.signals import worker_init

    from app.celery_app import celery, run_worker
    from app.settings import load_settings

    @celery.task(name=HOLD, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
    def hold(seconds: float, marker: str) -> None:
        time.sleep(seconds)
        Path(marker).write_text("done")

    if stock:

        @worker_init.connect
        def _stock_transport(**_: object) -> None:
            celery.conf.broker_transport = None  # kombu's own redis transport

    run_worker(load_settings(), concurrency=2)


@dataclass
class Round:
    survived: bool
    recovered_s: float | None


def run(workdir: Path, mode: str, rounds: int, stock: bool) -> tuple[list[Round], Path]:
    """Run the reproducer; returns each round's outcome and the worker's log."""
    from celery import Celery

    from app import migrate

    server = PrivateRedis(workdir / "redis")
    server.start()
    db = f"sqlite:///{workdir / 'db.sqlite'}"
    migrate.upgrade(db)
    env = dict(os.environ, BROKER_URL=server.url(), DATABASE_URL=db, NETS="[]",
               FL_DISPATCHER_DATA_DIR=str(workdir / "data"), LOG_LEVEL="INFO",
               PYTHONPATH=str(REPO))  # fmt: skip
    log_path = workdir / "worker.log"
    argv = [sys.executable, "-m", "tests.tools.redis_restart_repro", "--worker"]
    if stock:
        argv.append("--stock")
    with log_path.open("wb") as out:
        worker = subprocess.Popen(argv, env=env, cwd=REPO, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    sender = Celery(broker=server.url())
    sender.conf.broker_connection_retry_on_startup = True
    results: list[Round] = []
    try:
        _wait_log(log_path, "ready.", worker, 60)
        for n in range(1, rounds + 1):
            held = {"seconds": 10 if mode == "sleep" else 0, "marker": str(workdir / f"h{n}")}
            countdown = 30 if mode == "eta" else None
            sender.send_task(HOLD, kwargs=held, queue="fl_dispatcher", countdown=countdown)
            _wait_log(log_path, f"{HOLD}[", worker, 30, count=n)
            time.sleep(1)  # the consumer is back in BRPOP, holding the message
            started = time.monotonic()
            server.restart(down_s=1.0)
            probe = workdir / f"probe-{n}"
            sent = False
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not probe.exists() and worker.poll() is None:
                if not sent:
                    try:
                        sender.send_task(HOLD, kwargs={"seconds": 0, "marker": str(probe)},
                                         queue="fl_dispatcher")  # fmt: skip
                        sent = True
                    except Exception:  # the sender reconnects too; try again
                        pass
                time.sleep(0.1)
            ok = worker.poll() is None and probe.exists()
            results.append(Round(ok, time.monotonic() - started if ok else None))
            if not ok:
                break
    finally:
        sender.close()
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=10)
        server.stop()
    return results, log_path


def _wait_log(path: Path, needle: str, proc: subprocess.Popen[bytes], timeout_s: float,
              count: int = 1) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.read_text(errors="replace").count(needle) >= count:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited early; see {path}")
        time.sleep(0.1)
    raise TimeoutError(f"{needle!r} not in {path} after {timeout_s}s")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["eta", "sleep"], default="eta")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stock", action="store_true", help="kombu's own Redis transport")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.stock)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="redis-repro-"))
    results, log_path = run(workdir, args.mode, args.rounds, args.stock)
    for n, outcome in enumerate(results, 1):
        if outcome.survived:
            print(f"round {n}: worker alive, consumed again {outcome.recovered_s:.1f}s "
                  "after Redis was killed")  # fmt: skip
        else:
            print(f"round {n}: worker DIED or stopped consuming")
    keys = ("CRITICAL", "Restoring", "lost", "hostname", "already dead", "Connected to")
    lines = log_path.read_text(errors="replace").splitlines()
    print("\n".join(line for line in lines if any(k in line for k in keys)))
    survived = len(results) == args.rounds and all(r.survived for r in results)
    if survived:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"worker log: {log_path}")
    print("SURVIVED" if survived else "CRASHED")
    return 0 if survived else 1


if __name__ == "__main__":
    sys.exit(main())

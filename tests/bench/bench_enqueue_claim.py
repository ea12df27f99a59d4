"""Benchmark (not a test): enqueue and claim latency, and peak RSS.

    .venv/bin/python -m tests.bench.bench_enqueue_claim [--jobs 500] [--nets 20] [--projects 10]
        [--place 20]

Runs against the machine's PostgreSQL in a throw-away database: enqueue throughput,
the claim latency of assign_next_job with a deep queue, and this process's peak RSS. With
`--projects N` the jobs belong to N projects in turn (every other one weighing 2 in
PROJECT_SHARES), so each claim orders the queue by fair share; 0: no project. With
`--place N`, once the nets are taken, the place in line and waiting reason of N queued jobs
spread over the queue (app/usecases/queue_place.py, as `GET /jobs/{id}` reads them).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from app import migrate
from app.db import make_engine, session_factory, unit_of_work
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases import claims, declared_nets, enqueue
from app.usecases.queue_place import queue_place
from models import Job, JobState, utcnow
from tests.fixtures.db import PG_ADMIN_URL  # FL_TEST_PG_URL, as the tests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--nets", type=int, default=20)
    parser.add_argument("--projects", type=int, default=0)
    parser.add_argument("--place", type=int, default=0, metavar="N")
    args = parser.parse_args()

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"fld_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "jobs" / "job").mkdir(parents=True)
            nets = []
            for i in range(args.nets):
                kit = root / f"kit{i}" / "startup"
                kit.mkdir(parents=True)
                (kit / "fed_admin.json").write_text("{}")
                nets.append(
                    {
                        "name": f"net-{i}",
                        "driver": {"kind": "static"},
                        "admin": {"kit_dir": str(kit.parent), "username": "a"},
                    }
                )
            shares = {f"p{i}": {"weight": 2} for i in range(0, args.projects, 2)}
            settings = Settings(
                DATABASE_URL=url,
                JOB_ROOT=root / "jobs",
                NETS=json.dumps(nets),
                PROJECT_SHARES=json.dumps(shares),
            )
            migrate.upgrade(url)
            engine = make_engine(url)
            factory = session_factory(engine)
            with unit_of_work(factory) as session:
                declared_nets.sync_nets(session, settings, utcnow())

            enqueue_ms = []
            for i in range(args.jobs):
                project = f"p{i % args.projects}" if args.projects else None
                request = EnqueueJob(
                    caller_key=f"k{i}", definition="job", required_sites=["s"], project_id=project
                )
                start = time.perf_counter()
                with unit_of_work(factory) as session:
                    enqueue.enqueue_job(session, settings, request, utcnow())
                enqueue_ms.append((time.perf_counter() - start) * 1000)

            claim_ms = []
            for _ in range(args.nets):
                start = time.perf_counter()
                with unit_of_work(factory) as session:
                    assert claims.claim_next_job(session, settings, utcnow()) is not None
                claim_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            with unit_of_work(factory) as session:
                assert claims.claim_next_job(session, settings, utcnow()) is None
            no_free_ms = (time.perf_counter() - start) * 1000
            place_ms = _places(factory, settings, args.place)
            engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    def p(values: list[float], q: float) -> float:
        return sorted(values)[int(q * (len(values) - 1))]

    print(
        f"enqueue x{args.jobs}: median {statistics.median(enqueue_ms):.2f} ms, "
        f"p95 {p(enqueue_ms, 0.95):.2f} ms"
    )
    print(
        f"assign_next_job with {args.jobs} queued, {args.nets} nets, {args.projects} projects: "
        "median "
        f"{statistics.median(claim_ms):.2f} ms, max {max(claim_ms):.2f} ms; "
        f"no free net: {no_free_ms:.2f} ms"
    )
    if place_ms:
        print(
            f"place in line of {len(place_ms)} of {args.jobs - args.nets} queued: median "
            f"{statistics.median(place_ms):.2f} ms, max {max(place_ms):.2f} ms"
        )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak_mib:.0f} MiB")


def _places(factory: object, settings: Settings, count: int) -> list[float]:
    """The time of `count` queued jobs' place and reason, spread over the queue (each once
    unmeasured first, so every statement is built and planned)."""
    if count <= 0:
        return []
    with unit_of_work(factory) as session:  # type: ignore[arg-type]
        queued = list(
            session.scalars(
                select(Job.id).where(Job.state == JobState.QUEUED).order_by(Job.created_at)
            )
        )
    picked = [queued[i * (len(queued) - 1) // max(1, count - 1)] for i in range(count)]
    ms = []
    for job_id in [picked[0], *picked]:
        with unit_of_work(factory) as session:  # type: ignore[arg-type]
            job = session.get(Job, job_id)
            start = time.perf_counter()
            queue_place(session, job, settings, utcnow())
            ms.append((time.perf_counter() - start) * 1000)
    return ms[1:]


if __name__ == "__main__":
    main()

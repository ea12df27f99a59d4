"""Benchmark (not a test): GET /nets with many nets and a year of history.

    .venv/bin/python -m tests.bench.bench_nets_page [--nets 1000] [--days 365]
        [--jobs-per-day 1] [--requests 20] [--without-indexes] [--profile] [--json]

A throw-away PostgreSQL database (built by migrations) gets `nets` nets and, over `days`
days, `jobs-per-day` finished jobs a day on every net, each with its five job_events and a
cold start, run and idle scale-down as six net_events (at the defaults: 365,000 jobs,
1,825,000 job_events, 2,190,000 net_events). The last hour leaves 10% of the nets BUSY
with a RUNNING job (one in five of those FINISHING), 10% READY and idle, 1% MISCONFIGURED
with a queued job pinned to each, and one stray run on 1% of them. Then the page is
requested through the real app (FastAPI's TestClient: routing, the queries, the HTML) and
timed (wall, and this process's CPU: the app and the test client, which a loaded machine's
wall time hides). Goal: <= 100 ms at 1,000 nets and a year. `--without-indexes` drops migration
0008's indexes first, to show what they buy; `--profile` prints the statements' times.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.db import make_engine, session_factory
from app.entrypoints.api import create_app
from app.runtime import RecordingOutbox, Runtime
from app.settings import Settings
from tests.bench.common import (
    StatementCounter,
    StatementProfile,
    Timing,
    common_args,
    environment,
    nets_json,
    pg_database,
    print_table,
    ratio,
)

GOAL_MS = 100.0
HEADER = ["page", "median ms", "min ms", "max ms", "app CPU ms", "statements", "HTML KiB"]
HEADER += ["vs 100 ms"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)

_NETS = """
INSERT INTO nets (name, state, state_changed_at, version)
SELECT 'net-' || lpad(i::text, 4, '0'), 'STOPPED', CAST(:t0 AS timestamptz), 1
FROM generate_series(0, CAST(:nets AS int) - 1) i
"""

# Job i runs on net i % nets, day i / nets: enqueued at a time of day of its own, started
# cold (60-120 s), run 20-80 min, then the net idles 10 min and scales to zero.
_JOBS = """
INSERT INTO jobs (id, caller_key, definition, required_sites, net_name, priority, state,
                  attempts, retries, max_attempts, created_at, state_changed_at, assigned_at,
                  dispatched_at, finished_at, version)
SELECT md5('job' || i)::uuid, 'job-' || i, 'tiny-job', '["site-1", "site-2"]'::json,
       'net-' || lpad((i % CAST(:nets AS int))::text, 4, '0'), 0,
       CASE WHEN i % 20 = 0 THEN 'FAILED' ELSE 'COMPLETED' END, 0, 0, 3,
       c, c + cold + run, c + interval '1 second', c + cold, c + cold + run, 1
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) i,
     LATERAL (SELECT CAST(:t0 AS timestamptz) + (i / CAST(:nets AS int)) * CAST(:every AS interval)
                     + ((i * 7919) % 64800) * interval '1 second' AS c,
                     (60 + i % 60) * interval '1 second' AS cold,
                     (20 + i % 60) * interval '1 minute' AS run) t
"""

_JOB_EVENTS = """
INSERT INTO job_events (job_id, from_state, to_state, at, reason, attempt)
SELECT j.id, s.f, COALESCE(s.t, j.state),
       CASE s.n WHEN 1 THEN j.created_at WHEN 2 THEN j.assigned_at
                WHEN 3 THEN j.dispatched_at - interval '1 second' WHEN 4 THEN j.dispatched_at
                ELSE j.finished_at END, s.r, 0
FROM jobs j
JOIN (VALUES (NULL, 'QUEUED', 'enqueued', 1), ('QUEUED', 'ASSIGNED', 'net reserved', 2),
             ('ASSIGNED', 'DISPATCHING', 'submitting', 3),
             ('DISPATCHING', 'RUNNING', 'submitted', 4),
             ('RUNNING', NULL, 'run finished', 5)) AS s(f, t, r, n) ON true
WHERE j.caller_key LIKE 'job-%' AND j.created_at >= CAST(:lo AS timestamptz)
      AND j.created_at < CAST(:hi AS timestamptz)
ORDER BY j.created_at, s.n
"""

_NET_EVENTS = """
INSERT INTO net_events (net_name, from_state, to_state, at, reason)
SELECT j.net_name, s.f, s.t,
       CASE s.n WHEN 1 THEN j.assigned_at WHEN 2 THEN j.dispatched_at - interval '2 second'
                WHEN 3 THEN j.dispatched_at WHEN 4 THEN j.finished_at
                WHEN 5 THEN j.finished_at + interval '600 second'
                ELSE j.finished_at + interval '630 second' END, s.r
FROM jobs j
JOIN (VALUES ('STOPPED', 'STARTING', 'job assigned', 1), ('STARTING', 'READY', 'ready', 2),
             ('READY', 'BUSY', 'job running', 3), ('BUSY', 'READY', 'no active job', 4),
             ('READY', 'STOPPING', 'idle grace passed', 5),
             ('STOPPING', 'STOPPED', 'scaled to zero', 6)) AS s(f, t, r, n) ON true
WHERE j.caller_key LIKE 'job-%' AND j.created_at >= CAST(:lo AS timestamptz)
      AND j.created_at < CAST(:hi AS timestamptz)
ORDER BY j.created_at, s.n
"""


def build_history(engine: Engine, nets: int, days: int, per_day: int, now: datetime) -> None:
    """The year described in the module docstring, generated in SQL month by month."""
    every = timedelta(days=1) / per_day
    total = nets * days * per_day
    with engine.begin() as conn:
        conn.execute(text(_NETS), {"nets": nets, "t0": T0})
        for start in range(0, total, 100_000):
            bounds = {"lo": start, "hi": min(start + 99_999, total - 1)}
            conn.execute(text(_JOBS), {**bounds, "nets": nets, "t0": T0, "every": every})
        for month in range(0, days + 31, 30):
            bounds = {"lo": T0 + timedelta(days=month), "hi": T0 + timedelta(days=month + 30)}
            conn.execute(text(_JOB_EVENTS), bounds)
            conn.execute(text(_NET_EVENTS), bounds)
    _last_hour(engine, nets, now)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))


def _last_hour(engine: Engine, nets: int, now: datetime) -> None:
    """Busy, idle and misconfigured nets now, with the moves that took them there."""
    from models import Job, JobState, Net, NetState, StrayRun

    sessions = session_factory(engine)
    with sessions.begin() as session:
        rows = {n.name: n for n in session.query(Net)}
        for i in range(nets):
            net = rows[f"net-{i:04d}"]
            # The generated history ends with every net STOPPED; what the last hour did:
            net.state, net.state_changed_at = NetState.STOPPED, now - timedelta(hours=2)
            at = now - timedelta(minutes=50 + i % 7)
            if i % 10 == 0:  # BUSY with a run, one in five FINISHING
                job = Job.new(caller_key=f"now-{i}", definition="tiny-job",
                              required_sites=["site-1", "site-2"], requested_net=None,
                              priority=0, max_attempts=3, now=at)  # fmt: skip
                session.add(job)
                net.transition(NetState.STARTING, at, "job assigned")
                job.assign(net.name, at)
                net.transition(NetState.READY, at + timedelta(seconds=70), "ready")
                job.start_dispatch(at + timedelta(seconds=71))
                job.mark_running(f"nvf-{i}", at + timedelta(seconds=72))
                net.transition(NetState.BUSY, at + timedelta(seconds=72), "job running")
                if i % 50 == 0:
                    job.transition(JobState.FINISHING, now - timedelta(minutes=5), "run finished")
            elif i % 10 == 1:  # READY, idle inside its grace
                net.transition(NetState.STARTING, at, "job assigned")
                net.transition(NetState.READY, at + timedelta(seconds=70), "ready")
                net.mark_idle(now - timedelta(minutes=3))
            elif i % 100 == 2:  # MISCONFIGURED, its pinned job waiting
                net.transition(NetState.MISCONFIGURED, at, "admin: misconfigured: wrong kit")
                net.last_error = "admin: misconfigured: wrong kit"
                session.add(
                    Job.new(
                        caller_key=f"pinned-{i}",
                        definition="tiny-job",
                        required_sites=["site-1"],
                        requested_net=net.name,
                        priority=0,
                        max_attempts=3,
                        now=at,
                    )
                )
            session.flush()
            if i % 100 == 10:
                job_id = session.query(Job.id).filter(Job.caller_key == f"now-{i}").scalar()
                session.add(StrayRun(net_name=net.name, job_id=job_id, nvflare_job_id="nvf-x",
                                     reason="abort not confirmed", created_at=at))  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    now = T0 + timedelta(days=args.days)
    with pg_database() as url, tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(url)
        try:
            build_history(engine, args.nets, args.days, args.jobs_per_day, now)
            if args.without_indexes:
                with engine.begin() as conn:
                    for index in (
                        "ix_net_events_net_name_at",
                        "ix_job_events_at",
                        "ix_jobs_state_changed_at",
                        "ix_jobs_net_name_state_changed_at",
                    ):
                        conn.execute(text(f"DROP INDEX {index}"))
                    conn.execute(text("ANALYZE"))
            with engine.connect() as conn:
                rows = {
                    table: int(conn.scalar(text(f"SELECT count(*) FROM {table}")) or 0)
                    for table in ("nets", "jobs", "job_events", "net_events")
                }
            names = [f"net-{i:04d}" for i in range(args.nets)]
            settings = Settings(
                FL_DISPATCHER_DATA_DIR=Path(tmp) / "data",
                DATABASE_URL=url,
                PER_JOB_FL_SERVER="true",
                NETS=nets_json(Path(tmp) / "kit", names, lambda n: {"kind": "ecs",
                               "region": "eu-west-2", "cluster": "flip", "service": n}),
            )  # fmt: skip
            runtime = Runtime(
                settings=settings,
                engine=engine,
                sessions=session_factory(engine),
                clock=lambda: now,
                outbox=RecordingOutbox(),
            )
            client = TestClient(create_app(runtime))
            counter = StatementCounter().attach(engine)
            results = {}
            for label, params in (("all nets", {}), ("one net", {"net": names[10]})):
                assert client.get("/nets", params=params).status_code == 200  # warm
                counter.reset()
                timing = Timing()
                cpu_start = time.process_time()
                for _ in range(args.requests):
                    page = timing.measure(lambda p=params: client.get("/nets", params=p))
                results[label] = {
                    # This process's CPU (the app and the test client, not PostgreSQL): what
                    # a loaded machine's wall time does not show.
                    "cpu_ms": (time.process_time() - cpu_start) * 1000 / args.requests,
                    "median_ms": timing.median_ms,
                    "min_ms": min(timing.samples_ms),
                    "max_ms": max(timing.samples_ms),
                    "statements": counter.statements // args.requests,
                    "html_kib": len(page.content) / 1024,
                }
            top: list[tuple[int, float, str]] = []
            if args.profile:
                shapes = StatementProfile().attach(engine)
                client.get("/nets")
                shapes.detach(engine)
                top = shapes.top(12)
            return {"rows": rows, "pages": results, "top_statements": top}
        finally:
            engine.dispose()


def main() -> None:
    parser = common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--nets", type=int, default=1000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--jobs-per-day", type=int, default=1)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--without-indexes", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps({"benchmark": "nets_page", "goal_ms": GOAL_MS, "env": environment(),
                          "args": vars(args), **result}, indent=2))  # fmt: skip
        return
    rows = result["rows"]
    print_table(
        f"GET /nets, {rows['nets']:,} nets, {args.days} days: {rows['jobs']:,} jobs, "
        f"{rows['job_events']:,} job_events, {rows['net_events']:,} net_events"
        f"{' (without 0008 indexes)' if args.without_indexes else ''}; median of "
        f"{args.requests} requests; PostgreSQL {environment()}",
        HEADER,
        [
            [
                label,
                p["median_ms"],
                p["min_ms"],
                p["max_ms"],
                p["cpu_ms"],
                p["statements"],
                p["html_kib"],
                ratio(p["median_ms"], GOAL_MS),
            ]
            for label, p in result["pages"].items()
        ],
    )
    for count, total, sql in result["top_statements"]:
        print(f"    {count:4d} {total:8.1f}  {sql}")


if __name__ == "__main__":
    main()

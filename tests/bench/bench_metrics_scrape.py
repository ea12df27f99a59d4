"""Benchmark (not a test): one /metrics scrape by length of history.

    .venv/bin/python -m tests.bench.bench_metrics_scrape [--finished 10k,100k]
        [--history-per-job 10] [--nets 100] [--scrapes 5] [--verify] [--json]

For each size, a throw-away PostgreSQL database (built by migrations) gets `finished`
finished jobs with their job_events (5 per job, 7 for the 2% requeued once), plus net_events
(start/ready/busy/idle/stop cycles) and scale_events, so that the three history tables hold
`finished x history-per-job` rows in all (1,000,000 at 100k). Then:
- catch-up: what `fl-dispatcher db upgrade` does once after the migration that added the
  running totals (app.metrics.fold.catch_up, when the code has it): fold the existing history;
- first scrape: the first one after that (the old collector read the whole history here);
- steady scrape: median of `--scrapes`, each after one beat interval's worth of new
  activity (5 more finished jobs and 5 net start/stop cycles), the cost a Prometheus scrape
  pays in operation. Goal: <= 100 ms with 100k finished jobs and 1M history rows, and flat as
  history grows.
`--verify` checks every sample against a full scan of the tables (tests/metrics_reference.py,
the metrics' meaning), after the first and the last scrape.
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

import app.metrics.fold
from app.db import make_engine, session_factory
from app.metrics.exposition import build_registry, families
from tests.bench.common import (
    StatementCounter,
    StatementProfile,
    Timing,
    common_args,
    environment,
    int_list,
    pg_database,
    print_table,
    ratio,
)

GOAL_MS = 100.0
T0 = datetime(2025, 1, 1, tzinfo=UTC)
NOW = datetime(2027, 1, 1, tzinfo=UTC)  # the collector's clock: after every generated event

_NETS = """
INSERT INTO nets (name, state, state_changed_at, version)
SELECT 'net-' || lpad(i::text, 4, '0'), 'STOPPED', CAST(:t0 AS timestamptz), 1
FROM generate_series(0, CAST(:nets AS int) - 1) i
"""

# Finished jobs lo..hi: one in 20 FAILED, one in 33 ABORTED, the rest COMPLETED; one in 25
# retried twice; one in 50 requeued once before its last attempt.
_JOBS = """
INSERT INTO jobs (id, caller_key, definition, required_sites, net_name, priority, state,
                  attempts, retries, max_attempts, created_at, state_changed_at, assigned_at,
                  dispatched_at, finished_at, version)
SELECT md5('job' || i)::uuid, 'k' || i, 'job', '["site-1", "site-2"]'::json,
       'net-' || lpad((i % CAST(:nets AS int))::text, 4, '0'), 0,
       CASE WHEN i % 20 = 0 THEN 'FAILED' WHEN i % 33 = 0 THEN 'ABORTED' ELSE 'COMPLETED' END,
       CASE WHEN i % 50 = 0 THEN 2 ELSE 1 END, CASE WHEN i % 25 = 0 THEN 2 ELSE 0 END, 3,
       c, c + interval '1 hour', c + w, c + w + d, c + interval '1 hour', 1
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) i,
     LATERAL (SELECT CAST(:t0 AS timestamptz) + i * interval '20 second' AS c,
                     ((i * 7) % 900) * interval '1 second' AS w,
                     (5 + i % 120) * interval '1 second' AS d) t
"""

_JOB_EVENTS = """
INSERT INTO job_events (job_id, from_state, to_state, at, reason)
SELECT md5('job' || i)::uuid, s.f, CASE WHEN s.t = 'END' THEN j.state ELSE s.t END,
       j.created_at + s.k * (j.assigned_at - j.created_at) + s.m * (j.dispatched_at - j.assigned_at)
                    + s.h * interval '1 hour', s.r
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) i
JOIN jobs j ON j.id = md5('job' || i)::uuid
JOIN (VALUES (NULL, 'QUEUED', 0.0, 0.0, 0, 'enqueued', 1, false),
             ('QUEUED', 'ASSIGNED', 0.5, 0.0, 0, 'net reserved', 2, true),
             ('ASSIGNED', 'QUEUED', 0.75, 0.0, 0, 'requeued (attempt 1)', 3, true),
             ('QUEUED', 'ASSIGNED', 1.0, 0.0, 0, 'net reserved', 4, false),
             ('ASSIGNED', 'DISPATCHING', 1.0, 0.5, 0, 'submitting', 5, false),
             ('DISPATCHING', 'RUNNING', 1.0, 1.0, 0, 'submitted', 6, false),
             ('RUNNING', 'END', 0.0, 0.0, 1, 'finished', 7, false)
     ) AS s(f, t, k, m, h, r, n, requeue_only) ON (NOT s.requeue_only OR i % 50 = 0)
ORDER BY i, s.n
"""

# Net start/stop cycles lo..hi, spread over the nets: six net_events and two scale_events
# each; cycle c of a net starts c hours after T0 (plus the net's own offset).
_NET_EVENTS = """
INSERT INTO net_events (net_name, from_state, to_state, at, reason)
SELECT 'net-' || lpad((c % CAST(:nets AS int))::text, 4, '0'), s.f, s.t,
       CAST(:t0 AS timestamptz) + (c / CAST(:nets AS int)) * interval '1 hour'
           + (c % CAST(:nets AS int)) * interval '1 second'
           + s.o * interval '1 second' + CASE WHEN s.n >= 2 THEN (30 + c % 270) ELSE 0 END
             * interval '1 second', s.r
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) c
JOIN (VALUES ('STOPPED', 'STARTING', 0, 'job assigned', 1),
             ('STARTING', 'READY', 0, 'ready', 2),
             ('READY', 'BUSY', 5, 'job running', 3),
             ('BUSY', 'READY', 900, 'no active job', 4),
             ('READY', 'STOPPING', 1500, 'idle', 5),
             ('STOPPING', 'STOPPED', 1530, 'idle grace passed', 6)
     ) AS s(f, t, o, r, n) ON true
ORDER BY c, s.n
"""

_SCALE_EVENTS = """
INSERT INTO scale_events (net_name, action, replicas, reason, outcome, at)
SELECT 'net-' || lpad((c % CAST(:nets AS int))::text, 4, '0'), s.a, s.p, s.r,
       CASE WHEN c % 97 = 0 AND s.p = 1 THEN 'error: DriverTransientError' ELSE 'ok' END,
       CAST(:t0 AS timestamptz) + (c / CAST(:nets AS int)) * interval '1 hour'
           + (c % CAST(:nets AS int)) * interval '1 second'
           + s.o * interval '1 second'
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) c
JOIN (VALUES ('scale_up', 1, 'job assigned', 0, 1),
             ('scale_down', 0, 'idle grace passed', 1500, 2)) AS s(a, p, r, o, n) ON true
ORDER BY c, s.n
"""


class History:
    """Generates the history in SQL (fast) and adds to it between scrapes."""

    def __init__(self, engine: Engine, nets: int, finished: int, per_job: int) -> None:
        self.engine = engine
        self.nets = nets
        self.jobs = 0
        self.cycles = 0
        with engine.begin() as conn:
            conn.execute(text(_NETS), {"nets": nets, "t0": T0})
        job_rows = int(finished * 5.04)
        cycles = max(nets, (finished * per_job - job_rows) // 8)
        self.add(finished, cycles)
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))

    def add(self, jobs: int, cycles: int) -> None:
        with self.engine.begin() as conn:
            for start in range(self.jobs + 1, self.jobs + jobs + 1, 50_000):
                bounds = {"lo": start, "hi": min(start + 49_999, self.jobs + jobs)}
                conn.execute(text(_JOBS), {**bounds, "nets": self.nets, "t0": T0})
                conn.execute(text(_JOB_EVENTS), bounds)
            bounds = {"lo": self.cycles, "hi": self.cycles + cycles - 1, "nets": self.nets}
            conn.execute(text(_NET_EVENTS), {**bounds, "t0": T0})
            conn.execute(text(_SCALE_EVENTS), {**bounds, "t0": T0})
        self.jobs += jobs
        self.cycles += cycles

    def rows(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return {
                table: int(conn.scalar(text(f"SELECT count(*) FROM {table}")) or 0)
                for table in ("jobs", "job_events", "net_events", "scale_events")
            }


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def differences(got: bytes, want: bytes) -> list[str]:
    """Samples that differ between two exposition texts (sums within a microsecond each)."""
    a, b = samples(got), samples(want)
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x is None or y is None or not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-3):
            out.append(f"{key}: scrape {x} != tables {y}")
    return out


def reference_text(engine: Engine) -> bytes:
    from tests.metrics_reference import reference_snapshot  # the meaning, as a full scan

    with session_factory(engine)() as session:
        snap = reference_snapshot(session, NOW)

    class Fixed:
        def collect(self) -> list[Any]:
            return families(snap)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    return generate_latest(registry)


def run(
    finished: int,
    per_job: int,
    nets: int,
    scrapes: int,
    verify: bool,
    profile: bool,
    callbacks: bool = False,
) -> dict[str, Any]:
    with pg_database() as url:
        engine = make_engine(url)
        try:
            history = History(engine, nets, finished, per_job)
            rows = history.rows()
            sessions = session_factory(engine)
            registry = (
                build_registry(sessions, lambda: NOW, callbacks=True)
                if callbacks
                else build_registry(sessions, lambda: NOW)
            )
            catch_up = getattr(app.metrics.fold, "catch_up", None)
            caught_up = Timing()
            if catch_up is not None:
                caught_up.measure(lambda: catch_up(sessions))
            counter = StatementCounter().attach(engine)
            first = Timing()
            body = first.measure(lambda: generate_latest(registry))
            first_statements = counter.statements
            problems = differences(body, reference_text(engine)) if verify else []
            steady = Timing()
            for _ in range(scrapes):
                history.add(jobs=5, cycles=5)
                counter.reset()
                body = steady.measure(lambda: generate_latest(registry))
            steady_statements = counter.statements
            if verify:
                problems += differences(body, reference_text(engine))
            top: list[tuple[int, float, str]] = []
            if profile:
                history.add(jobs=5, cycles=5)
                shapes = StatementProfile().attach(engine)
                generate_latest(registry)
                shapes.detach(engine)
                top = shapes.top(40)
            return {
                "finished_jobs": finished,
                "history_rows": rows["job_events"] + rows["net_events"] + rows["scale_events"],
                "rows": rows,
                "catch_up_ms": caught_up.median_ms if catch_up is not None else None,
                "first_ms": first.median_ms,
                "first_statements": first_statements,
                "steady_ms": steady.median_ms,
                "steady_statements": steady_statements,
                "verified": (not problems) if verify else None,
                "problems": problems[:20],
                "top_statements": top,
            }
        finally:
            engine.dispose()


def main() -> None:
    parser = common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--finished", type=int_list, default=[10_000, 100_000])
    parser.add_argument("--history-per-job", type=int, default=10)
    parser.add_argument("--nets", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--verify", action="store_true", help="compare with a full table scan")
    parser.add_argument("--profile", action="store_true", help="statements of a steady scrape")
    parser.add_argument(
        "--callbacks", action="store_true", help="as with CALLBACK_URL set (delivery backlog)"
    )
    args = parser.parse_args()
    results = [
        run(
            n,
            args.history_per_job,
            args.nets,
            args.scrapes,
            args.verify,
            args.profile,
            args.callbacks,
        )
        for n in args.finished
    ]
    if args.json:
        print(json.dumps({"benchmark": "metrics_scrape", "goal_ms": GOAL_MS, "env": environment(),
                          "results": results}, indent=2))  # fmt: skip
        return
    header = ["finished jobs", "history rows", "catch-up ms", "first ms", "steady ms",
              "statements", "vs 100 ms", "equals tables"]  # fmt: skip
    rows = [
        [
            r["finished_jobs"],
            r["history_rows"],
            "-" if r["catch_up_ms"] is None else r["catch_up_ms"],
            r["first_ms"],
            r["steady_ms"],
            r["steady_statements"],
            ratio(r["steady_ms"], GOAL_MS),
            "-" if r["verified"] is None else "yes" if r["verified"] else "NO",
        ]
        for r in results
    ]
    print_table(
        f"/metrics scrape ({args.nets} nets; steady = median of {args.scrapes}, each after a "
        f"beat interval's new activity; PostgreSQL) {environment()}",
        header,
        rows,
    )
    for r in results:
        for problem in r["problems"]:
            print(f"  {r['finished_jobs']}: {problem}")
        if r["top_statements"]:
            print(f"\n  a steady scrape at {r['finished_jobs']} finished jobs (count, ms):")
            for count, total, sql in r["top_statements"]:
                print(f"    {count:4d} {total:8.1f}  {sql}")


if __name__ == "__main__":
    main()

"""Benchmark (not a test): SQL statements and commits per job lifecycle, by use case.

    .venv/bin/python -m tests.bench.bench_statements [--jobs 20] [--reported] [--shapes]
        [--json]

Each job goes through its whole lifecycle as the workers run it: flip-api's enqueue
request, the assign kick, the chain (`scale_up`, `wait_ready`, `dispatch`), one monitor
round that finds its run finished (COMPLETED), with `--reported` flip-api's results report
(RELEASE_AFTER=reported), and every status callback delivered to a receiver that answers
200. Every message is handled by `app.handlers.HANDLERS`' call for its name, in the order
it was sent, on a runtime wired as a worker's (`celery_runtime`: coalesced kicks, the
callback kick after every commit that wrote history); the driver and the admin client are
the project's fakes (tests/fakes.py), so only the dispatcher's own SQL counts. Each job is
pinned to a net of its own, STOPPED: a cold start every time. One job runs first unmeasured
(the receiver's row, the statement caches).

Two columns: PostgreSQL (a throw-away database built by the migrations) and SQLite (the
simulator's engine, `app.sim.db.memory_db`: an in-memory copy of the migrated schema).
Statements are what SQLAlchemy sends to the driver (`before_cursor_execute`); commits are
transactions ended. Goal (issue 37): statements per job on PostgreSQL halved against the
figure measured before that work (`BEFORE_PG`). `--shapes` lists, per use case, the
statement shapes sent and how often.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from app import names
from app.adapters.callbacks import Answer
from app.db import make_engine, session_factory
from app.handlers import HANDLERS, ends_chain
from app.runtime import Runtime
from app.schemas import job_id_for
from app.settings import Settings
from app.usecases.callbacks import send_after_commit
from app.usecases.kicks import coalesce_kicks
from models import Job, JobState
from tests.bench.common import common_args, environment, nets_json, pg_database, print_table
from tests.fakes import FakeAdmin, FakeDriver, FakeServer

# Statements per job on PostgreSQL before issue 37's work (main at 995bd99, this benchmark
# added); the goal is half of it.
BEFORE_PG = 151.0
SECRET = "a-callback-secret-of-some-length"
CHAIN = (names.SCALE_UP, names.WAIT_READY, names.DISPATCH)
MAX_MESSAGES_PER_JOB = 200  # a loop that never settles is a bug in the benchmark's world
IDLE = "-"


def _short(task: str) -> str:
    return task.rsplit(".", 1)[-1]


class Bus:
    """An outbox that keeps every message in the order it was sent, for the benchmark to
    hand to its handler (the chain's next step follows its step, as Celery's chain does)."""

    def __init__(self) -> None:
        self.queue: deque[tuple[str, dict[str, Any]]] = deque()

    def send(self, task: str, **kwargs: Any) -> bool:
        """Queue one message."""
        self.queue.append((task, kwargs))
        return True

    def start_pipeline(self, job_id: str, net_name: str, attempt: int) -> None:
        """Queue the chain's first step."""
        ids = {"job_id": job_id, "net_name": net_name, "attempt": attempt}
        self.queue.append((names.SCALE_UP, ids))


class Receiver:
    """flip-api's callback endpoint: every event answered 200."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def post(self, body: bytes, _headers: Any) -> Answer:
        self.events.append(json.loads(body))
        return Answer(200)

    def close(self) -> None:
        """Nothing to close."""


@dataclass
class Tally:
    """Statements, commits and messages by use case (the handler that ran)."""

    statements: Counter[str] = field(default_factory=Counter)
    commits: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)
    shapes: dict[str, Counter[str]] = field(default_factory=dict)
    cpu_s: float = 0.0
    cpu_by_case: dict[str, float] = field(default_factory=dict)
    current: str = IDLE  # the benchmark's own reads between messages are not counted
    on: bool = False

    def attach(self, engine: Engine) -> None:
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if self.on and self.current != IDLE:
            self.statements[self.current] += 1
            shape = " ".join(statement.split())[:160]
            self.shapes.setdefault(self.current, Counter())[shape] += 1

    def _commit(self, *_: Any) -> None:
        if self.on and self.current != IDLE:
            self.commits[self.current] += 1


class World:
    """N + 1 scale-to-zero nets (one per job, the first for the unmeasured job) on one
    database, a worker's runtime with fakes, and the message bus."""

    def __init__(
        self, engine: Engine, database_url: str, tmp: Path, jobs: int, reported: bool
    ) -> None:
        self.names = [f"net-{i:03d}" for i in range(jobs + 1)]
        (tmp / "jobs" / "job" / "app" / "config").mkdir(parents=True, exist_ok=True)
        (tmp / "jobs" / "job" / "meta.json").write_text(
            '{"name": "job", "deploy_map": {"app": ["@ALL"]}, "min_clients": 2}'
        )
        settings = Settings(
            DATABASE_URL=database_url,
            JOB_ROOT=tmp / "jobs",
            PER_JOB_FL_SERVER="true",
            FL_DISPATCHER_DATA_DIR=tmp / "data",
            CALLBACK_URL="http://flip-api.invalid/callbacks",
            CALLBACK_SECRET=SECRET,
            RELEASE_AFTER="reported" if reported else "finished",
            NETS=nets_json(
                tmp / "kit",
                self.names,
                lambda name: {
                    "kind": "ecs",
                    "region": "eu-west-2",
                    "cluster": "flip",
                    "service": f"fl-{name}",
                },
            ),
        )
        self.drivers = {n: FakeDriver(replicas=0) for n in self.names}
        self.servers = {n: FakeServer(driver=self.drivers[n]) for n in self.names}
        self.bus = Bus()
        self.receiver = Receiver()
        self.reported = reported
        self.rt = Runtime(
            settings=settings,
            engine=engine,
            sessions=session_factory(engine),
            driver_factory=lambda net, _s: self.drivers[net.name],
            admin_factory=lambda net, _s: FakeAdmin(self.servers[net.name]),
            outbox=self.bus,
            callback_sender=self.receiver,
        )
        coalesce_kicks(self.rt)  # as celery_runtime wires a worker's runtime
        send_after_commit(self.rt)
        self.tally = Tally()
        self.tally.attach(engine)

    def deliver(self, task: str, **kwargs: Any) -> object:
        """Hand one message to its handler, counted under its name."""
        handler = HANDLERS[task]
        self.tally.current = _short(task)
        self.tally.messages[self.tally.current] += 1
        start = time.process_time()
        try:
            return handler.call(self.rt, **kwargs)
        finally:
            spent = time.process_time() - start
            self.tally.cpu_s += spent
            case = self.tally.current
            self.tally.cpu_by_case[case] = self.tally.cpu_by_case.get(case, 0.0) + spent
            self.tally.current = IDLE

    def drain(self) -> None:
        """Handle every queued message (and those they send) until none is left."""
        for _ in range(MAX_MESSAGES_PER_JOB):
            if not self.bus.queue:
                return
            task, kwargs = self.bus.queue.popleft()
            result = self.deliver(task, **kwargs)
            again = HANDLERS[task].again_in(self.rt.settings, result)
            if again is not None and task != names.DELIVER_CALLBACKS:
                self.bus.queue.append((task, kwargs))  # a readiness poll: no wait with fakes
            elif task in CHAIN and not ends_chain(result) and task != CHAIN[-1]:
                self.bus.queue.append((CHAIN[CHAIN.index(task) + 1], kwargs))
        raise SystemExit(f"messages never settled: {list(self.bus.queue)[:5]}")

    def lifecycle(self, index: int) -> None:
        """One job from flip-api's enqueue to COMPLETED with every callback delivered."""
        net = self.names[index]
        key = f"bench-{index:03d}"
        payload = {"caller_key": key, "definition": "job", "net": net}
        self.deliver(names.ENQUEUE_JOB, payload=payload)
        self.drain()
        job_id = job_id_for(key)
        self._expect(job_id, JobState.RUNNING)
        self.servers[net].statuses["nv-1"] = "FINISHED:COMPLETED"
        self.deliver(names.MONITOR_RUNNING_JOBS)
        self.drain()
        if self.reported:
            self._expect(job_id, JobState.FINISHING)
            report = {"job_id": str(job_id), "status": "results_uploaded"}
            self.deliver(names.REPORT_JOB_STATUS, payload=report)
            self.drain()
        self._expect(job_id, JobState.COMPLETED)
        last = self.receiver.events[-1]
        if last.get("job_id") != str(job_id) or last.get("to_state") != JobState.COMPLETED:
            raise SystemExit(f"job {key}: its last callback was {last}")

    def _expect(self, job_id: uuid.UUID, state: JobState) -> None:
        with self.rt.sessions() as session:
            job = session.get(Job, job_id)
            if job is None or job.state != state:
                found = job.state if job is not None else None
                raise SystemExit(f"job {job_id}: {found}, expected {state}")


def run(engine: Engine, database_url: str, jobs: int, reported: bool) -> dict[str, Any]:
    """The lifecycle of `jobs` jobs after one unmeasured; totals by use case."""
    with tempfile.TemporaryDirectory() as tmp:
        world = World(engine, database_url, Path(tmp), jobs, reported)
        world.lifecycle(0)  # warm-up: receiver row, statement caches
        world.tally = Tally(on=True)
        world.tally.attach(engine)
        for i in range(1, jobs + 1):
            world.lifecycle(i)
        tally = world.tally
        tally.on = False
        events = len(world.receiver.events)
        return {
            "jobs": jobs,
            "callbacks": events,
            "statements": dict(tally.statements),
            "commits": dict(tally.commits),
            "messages": dict(tally.messages),
            "shapes": {k: v.most_common() for k, v in tally.shapes.items()},
            "cpu_ms_per_job": tally.cpu_s * 1000 / jobs,
            "cpu_ms_by_case": {k: v * 1000 / jobs for k, v in tally.cpu_by_case.items()},
        }


@contextmanager
def postgresql() -> Iterator[tuple[Engine, str]]:
    with pg_database() as url:
        engine = make_engine(url)
        try:
            yield engine, url
        finally:
            engine.dispose()


@contextmanager
def sqlite() -> Iterator[tuple[Engine, str]]:
    from app.sim.db import memory_db  # the simulator's engine, as its sweep runs it

    engine, conn = memory_db()
    try:
        yield engine, "sqlite://"
    finally:
        conn.close()


def main() -> None:
    parser = common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--reported", action="store_true", help="RELEASE_AFTER=reported")
    parser.add_argument("--shapes", action="store_true", help="statement shapes per use case")
    args = parser.parse_args()

    results = {}
    for name, backend in (("postgresql", postgresql), ("sqlite", sqlite)):
        with backend() as (engine, url):
            results[name] = run(engine, url, args.jobs, args.reported)
    per_job = {name: sum(r["statements"].values()) / r["jobs"] for name, r in results.items()}
    goal = BEFORE_PG / 2 if BEFORE_PG else None
    if args.json:
        print(json.dumps({"benchmark": "statements", "env": environment(), "jobs": args.jobs,
                          "before_pg": BEFORE_PG, "goal_pg": goal, "per_job": per_job,
                          "results": results}, indent=2))  # fmt: skip
        return
    pg, lite = results["postgresql"], results["sqlite"]
    cases = sorted(set(pg["statements"]) | set(lite["statements"]) | set(pg["messages"]))
    n = args.jobs

    def each(counter: dict[str, int], case: str) -> Any:
        return counter.get(case, 0) / n

    rows: list[list[object]] = [
        [
            case,
            each(pg["messages"], case),
            each(pg["statements"], case),
            each(pg["commits"], case),
            each(lite["statements"], case),
            each(lite["commits"], case),
            pg["cpu_ms_by_case"].get(case, 0.0),
        ]
        for case in cases
    ]
    rows.append(
        [
            "whole lifecycle",
            sum(pg["messages"].values()) / n,
            per_job["postgresql"],
            sum(pg["commits"].values()) / n,
            per_job["sqlite"],
            sum(lite["commits"].values()) / n,
            pg["cpu_ms_per_job"],
        ]
    )
    print_table(
        f"Per job, enqueue to COMPLETED with its {pg['callbacks'] / (n + 1):.0f} callbacks "
        f"({n} jobs, a cold start each; fake driver/admin) {environment()}",
        [
            "use case",
            "messages",
            "PG statements",
            "PG commits",
            "SQLite statements",
            "SQLite commits",
            "PG CPU ms",
        ],
        rows,
    )
    print(
        f"  CPU in the use cases per job: PostgreSQL {pg['cpu_ms_per_job']:.1f} ms, "
        f"SQLite {lite['cpu_ms_per_job']:.1f} ms"
    )
    if goal:
        print(
            f"  PostgreSQL statements per job {per_job['postgresql']:.1f}: before "
            f"{BEFORE_PG:.1f}, goal <= {goal:.1f} (half): {per_job['postgresql'] / goal:.2f}x"
        )
    if args.shapes:
        for case in cases:
            print(f"\n  {case}, statement shapes on PostgreSQL (per job, statement):")
            for shape, count in pg["shapes"].get(case, []):
                print(f"    {count / n:6.2f}  {shape}")


if __name__ == "__main__":
    main()

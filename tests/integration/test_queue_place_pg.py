"""A job's place in line and waiting reason (app/usecases/queue_place.py) and the claim's
order on the real PostgreSQL, against a reading of the documented rules in Python
(tasks/README.md "Place in line and waiting reason", app/usecases/README.md "The claim's
order"): random worlds of three nets, jobs of the default project, of weighted and capped
projects and of one PROJECT_SHARES does not name, pinned or not, enqueued at the same instant
or apart, AGING_S at its bounds, drains coming and going, stray runs of ended or requeued
jobs. The simulator checks the same on SQLite only (tests/sim/fair_share.py); this one caught
a capped project's jobs all shown place 1."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.settings import Settings
from app.usecases import claims, declared_nets
from app.usecases.queue_place import queue_place
from models import (
    ACTIVE_JOB_STATES,
    ASSIGNABLE_NET_STATES,
    Drain,
    Job,
    JobState,
    Net,
    StrayRun,
)
from tests.fixtures.db import net_decl
from tests.integration.test_pg_state import enqueue
from tests.unit.batch_world import end_one, stray_or_settle, toggle_drain

pytestmark = pytest.mark.integration

SHARES = {"a": {"weight": 2.0}, "b": {"max_nets": 1}, "c": {"weight": 0.5, "max_nets": 2}}


class Rows:
    """The documented rules, read from the rows now."""

    def __init__(self, session: Session, settings: Settings, now: datetime) -> None:
        self.shares = settings.shares
        self.before = now - self.shares.aging
        jobs = list(session.scalars(select(Job)))
        self.held = Counter(j.project_id for j in jobs if j.state in ACTIVE_JOB_STATES)
        strays = [(s.job_id, s.net_name) for s in session.scalars(select(StrayRun))]
        self.stray_jobs = {j for j, _ in strays}
        drains = {d.scope for d in session.scalars(select(Drain))}
        busy = {j.net_name for j in jobs if j.state in ACTIVE_JOB_STATES} | {n for _, n in strays}
        self.declared = [n.name for n in settings.nets]
        rows = {n.name: n for n in session.scalars(select(Net))}
        self.drained = {n for n in rows if n in drains or "*" in drains}
        self.free = {
            n
            for n, row in rows.items()
            if n in self.declared
            and row.state in ASSIGNABLE_NET_STATES
            and n not in self.drained | busy
        }
        self.known = set(rows)
        self.queue = [j for j in jobs if j.state == JobState.QUEUED]

    def key(self, job: Job) -> tuple[Any, ...]:
        if job.created_at < self.before:
            return (0, 0, 0, job.created_at, job.id)
        used = self.held[job.project_id]
        if self.shares.weights:
            used /= self.shares.weight(job.project_id)
        return (1, used, -job.priority, job.created_at, job.id)

    def capped(self, project: str | None) -> bool:
        cap = self.shares.cap(project)
        return cap is not None and self.held[project] >= cap

    def takeable(self) -> list[Job]:
        return [
            j for j in self.queue if j.id not in self.stray_jobs and not self.capped(j.project_id)
        ]

    def place(self, job: Job) -> tuple[int, str]:
        its = [n for n in self.declared if n in self.known and job.requested_net in (None, n)]
        waits_for = [n for n in its if n not in self.drained] or its
        ahead = sum(
            1
            for other in self.queue
            if other.id != job.id
            and other.id not in self.stray_jobs
            and (other.project_id == job.project_id or not self.capped(other.project_id))
            and self.key(other) < self.key(job)
            and any(other.requested_net in (None, n) for n in waits_for)
        )
        if job.id in self.stray_jobs:
            reason = "earlier run settling"
        elif self.capped(job.project_id):
            reason = "project at its cap"
        elif its and all(n in self.drained for n in its):
            reason = "net drained"
        else:
            reason = "claim pending" if self.free.intersection(its) else "no free net"
        return 1 + ahead, reason


@pytest.mark.parametrize("seed", [0, 2, 8, 10])
def test_places_and_claims_follow_the_documented_order(pg_factory, tmp_path, job_root, clock, seed):
    rnd = random.Random(seed)
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, n) for n in ("net-a", "net-b", "net-c")]),
        PROJECT_SHARES=json.dumps(SHARES),
        AGING_S=rnd.choice([1, 50, 300, 1e9]),
    )
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    for step in range(40):
        act = rnd.random()
        if act < 0.5:
            enqueue(
                pg_factory,
                settings,
                clock,
                f"job-{step}",
                project_id=rnd.choice([None, "a", "b", "c", "unnamed"]),
                priority=rnd.choice([0, 0, 1, 5]),
                net=rnd.choice([None, None, None, "net-a", "net-b"]),
            )
        elif act < 0.75:
            with pg_factory() as session:
                rows = Rows(session, settings, clock())
            with pg_factory.begin() as session:
                got = claims.claim_next_job(session, settings, clock())
            fitting = {
                n: [j for j in rows.takeable() if j.requested_net in (None, n)] for n in rows.free
            }
            if got is None:  # no job lost: none fits a free net
                assert not any(fitting.values()), step
            else:  # the first in the order of those that fit its net
                assert min(fitting[got.net_name], key=rows.key).id == got.job_id, step
        elif act < 0.82:  # a drain of one net comes or goes
            toggle_drain(pg_factory, clock, rnd.choice(["net-a", "net-c"]))
        elif act < 0.88:  # a run of an ended or waiting job, a stray on a net, or settled
            stray_or_settle(pg_factory, clock, rnd, f"run-{step}")
        else:
            end_one(pg_factory, clock, rnd)
        clock.advance(rnd.choice([0, 0, 10, 60]))
        with pg_factory() as session:
            rows = Rows(session, settings, clock())
            for job in rows.queue:
                found = queue_place(session, job, settings, clock())
                assert (found.place, found.reason) == rows.place(job), (step, job.caller_key)

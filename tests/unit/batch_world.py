"""A random world of queued jobs, drains, strays, caps and claims, in which every queued
job's place is read one by one (`queue_place`) and all at once (`queue_places`, shuffled,
with a duplicate and a job no longer QUEUED): the answers must be equal, and match the
claims run then (rolled back): a job at place 1 with a claim pending is claimed, one with
another reason is not.
Shared by the SQLite (unit) and PostgreSQL (integration) tests of `queue_places`."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.errors import DispatcherError
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases import claims, declared_nets, records
from app.usecases import enqueue as enqueue_uc
from app.usecases.queue_place import QueuePlace, queue_place, queue_places
from models import ACTIVE_JOB_STATES, Drain, Job, JobState, ReasonCode
from tests.fixtures.db import net_decl

SITES = {"net-a": None, "net-b": ["site-1", "site-2"], "net-c": ["site-1", "site-2", "s"]}


def settings_of(tmp_path: Path, job_root: Path, seed: int, *, sites: bool) -> Settings:
    """Three nets (with `sites`: two declare their sites), capped and weighted projects."""
    rnd = random.Random(seed)
    nets = [
        net_decl(tmp_path, n, **({"sites": s} if sites and s is not None else {}))
        for n, s in SITES.items()
    ]
    return Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps(nets),
        PROJECT_SHARES=json.dumps({"a": {"weight": 2.0}, "b": {"max_nets": 1}}),
        AGING_S=rnd.choice([1, 50, 1e9]),
    )


def run(factory: sessionmaker[Session], settings: Settings, clock: Any, seed: int) -> list[str]:
    """Drive the world; the differences found between one-by-one and batch answers."""
    rnd = random.Random(seed)
    diffs: list[str] = []
    with factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    for step in range(40):
        act = rnd.random()
        if act < 0.5:
            try:
                with factory.begin() as session:
                    enqueue_uc.enqueue_job(
                        session,
                        settings,
                        EnqueueJob(
                            caller_key=f"job-{step}",
                            definition="tiny-job",
                            required_sites=rnd.choice([["s"], ["site-1"], ["site-2", "s"]]),
                            project_id=rnd.choice([None, "a", "b", "unnamed"]),
                            priority=rnd.choice([0, 0, 1, 5]),
                            net=rnd.choice([None, None, "net-a", "net-b", "net-c"]),
                        ),
                        clock(),
                    )
            except DispatcherError:
                pass  # no net may run it
        elif act < 0.7:
            with factory.begin() as session:
                claims.claim_next_job(session, settings, clock())
        elif act < 0.8:
            toggle_drain(factory, clock, rnd.choice(["net-a", "net-c", "*"]))
        elif act < 0.88:
            stray_or_settle(factory, clock, rnd, f"run-{step}")
        else:
            end_one(factory, clock, rnd)
        clock.advance(rnd.choice([0, 0, 10, 60]))
        with factory() as session:
            jobs = list(session.scalars(select(Job)))
            queue = [j for j in jobs if j.state == JobState.QUEUED]
            one = {j.id: queue_place(session, j, settings, clock()) for j in queue}
            others = [j for j in jobs if j.state != JobState.QUEUED][:1]
            batch_of = queue + queue[:1] + others
            rnd.shuffle(batch_of)
            many = queue_places(session, batch_of, settings, clock())
            for job in queue:
                if many[job.id] != one[job.id]:
                    diffs.append(f"{step} {job.caller_key}: {one[job.id]} vs {many[job.id]}")
            for job in others:  # its one-job answer, as if queued
                if many[job.id] != queue_place(session, job, settings, clock()):
                    diffs.append(f"{step} {job.caller_key} ({job.state}): differs")
            diffs += _claims_disagree(session, settings, clock(), {j.id: one[j.id] for j in queue})
    return diffs


def _claims_disagree(
    session: Session, settings: Settings, now: Any, places: dict[Any, QueuePlace]
) -> list[str]:
    """The claims that would run now, rolled back, against the places read before them."""
    claimed = set()
    while (got := claims.claim_next_job(session, settings, now)) is not None:
        claimed.add(got.job_id)
    session.rollback()
    found = []
    for job_id, place in places.items():
        if (place.place, place.reason) == (1, "claim pending") and job_id not in claimed:
            found.append(f"{job_id} {place}: not claimed")
        if place.reason != "claim pending" and job_id in claimed:
            found.append(f"{job_id} {place}: claimed")
    return found


def toggle_drain(factory: sessionmaker[Session], clock: Any, scope: str) -> None:
    """A drain of `scope` comes, or goes if it is there."""
    with factory.begin() as session:
        found = session.get(Drain, scope)
        if found is None:
            session.add(Drain(scope=scope, drained_at=clock()))
        else:
            session.delete(found)


def stray_or_settle(
    factory: sessionmaker[Session], clock: Any, rnd: random.Random, run: str
) -> None:
    """A net's strays are settled; on a net with none, a run of an ended or waiting job."""
    with factory.begin() as session:
        owners = (JobState.ABORTED, JobState.QUEUED)
        runs_of = [j for j in session.scalars(select(Job)) if j.state in owners]
        net = rnd.choice(["net-a", "net-b"])
        if runs_of and not records.clear_stray_runs(session, net):
            records.add_stray_run(
                session,
                net_name=net,
                job_id=rnd.choice(runs_of).id,
                nvflare_job_id=run,
                submit_token=None,
                reason="a run no job counts",
                now=clock(),
            )


def end_one(factory: sessionmaker[Session], clock: Any, rnd: random.Random) -> None:
    """One active job, if any, is aborted."""
    with factory.begin() as session:
        active = [j for j in session.scalars(select(Job)) if j.state in ACTIVE_JOB_STATES]
        if active:
            ending = rnd.choice(active).id
            records.finish_job(
                session, ending, JobState.ABORTED, "over", clock(), code=ReasonCode.ABORTED
            )

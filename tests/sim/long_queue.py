"""A long queue for one net's site (round 20, 0e920a5): in bands of the first draw of
`f"{seed}/long-queue"` (about 5.5% of the worlds; none of the safeguards' and sweep-seed
tests' seeds in them, so every other world replays exactly), every net declares its sites
and one of them (the wide net) has a third, `site-3`, no other net has. Flip-api sends a
burst of 55-60 jobs needing `site-3` (each run 110-140 s: they wait for the wide net, one
run at a time), then, 3-10 s later, one job needing `site-1` only (`FITS`), which every net
may run; it aborts the burst's jobs still unended once the fitting job could have starved
past the checker's bound (`queued-while-free`) and a while more. The sweep's worlds never
queued more than a handful of jobs.

Before 0e920a5 a claim of a net that declares its sites looked through its next 50 QUEUED
jobs only: with 50 or more of the burst ahead, a free net that lacks `site-3` took nothing,
while its idle scale-down (`claims.queued_job_fits`, which read every job) kept its server
up for the fitting job: `queued-while-free` (the checker's free nets are those the job's
sites fit, `WorldState.fits`, so the burst's jobs themselves starve on no net but the wide
one; `idle-net-at-zero` counts the same jobs). The jobs are the workload's (flip-api's
sends as every job's, at their times, under the profile's message faults); the aborts are
never dropped by the broker (a burst job left QUEUED would run for hours)."""

from __future__ import annotations

import dataclasses
import random

from app import names
from app.schemas import job_id_for
from app.sim.simulation import Simulation
from app.sim.workload import SITES, JobSpec, Workload, WorldSpec
from models import TERMINAL_JOB_STATES, JobState

# Gaps between the named seeds' draws of this stream (tests/unit/test_sweep_seeds.py,
# test_simulation*.py, test_*safeguards.py, test_*_sim.py: every seed they run, every
# integer listed in them, and 0-199; a margin of 0.0005 each side).
BANDS = (
    (0.0048, 0.0117),
    (0.1484, 0.1559),
    (0.3482, 0.3565),
    (0.6585, 0.6670),
    (0.7173, 0.7257),
    (0.8389, 0.8471),
    (0.9884, 0.9962),
)
STREAM = "long-queue"
SITE = "site-3"  # the wide net's own site
KEY = "long-queue-"  # the burst's keys: long-queue-0, long-queue-1, ...
FITS = "long-queue-fits"  # the job every net may run, sent behind the burst
WATCH_S = 15.0  # how often flip-api looks at the fitting job


def in_bands(seed: int) -> bool:
    """Whether the seed's world sends the long queue."""
    first = random.Random(f"{seed}/{STREAM}").random()
    return any(lo <= first < hi for lo, hi in BANDS)


def with_long_queue(seed: int, world: WorldSpec, workload: Workload) -> tuple[WorldSpec, Workload]:
    """A band world's nets (all declaring their sites, the wide net with `SITE`) and its jobs
    (the burst, then the fitting one); every other world as it was."""
    if not in_bands(seed):
        return world, workload
    rng = random.Random(f"{seed}/{STREAM}")
    rng.random()  # the band's draw
    wide = rng.randrange(len(world.nets))
    nets = tuple(
        dataclasses.replace(
            n, declares_sites=True, sites=(*n.sites, SITE) if i == wide else n.sites
        )
        for i, n in enumerate(world.nets)
    )
    at = round(rng.uniform(10.0, 100.0), 1)
    count = rng.randint(55, 60)
    burst = tuple(
        JobSpec(
            key=f"{KEY}{i}",
            arrive_s=round(at + 0.1 * i, 1),
            duration_s=round(rng.uniform(110.0, 140.0), 1),
            sites=(SITE,),
        )
        for i in range(count)
    )
    fits_at = round(at + 0.1 * count + rng.uniform(3.0, 10.0), 1)
    fits = JobSpec(
        key=FITS,
        arrive_s=fits_at,
        duration_s=round(rng.uniform(15.0, 60.0), 1),
        sites=SITES[:1],
    )
    jobs = (*workload.jobs, *burst, fits)
    return dataclasses.replace(world, nets=nets), dataclasses.replace(workload, jobs=jobs)


def burst_keys(sim: Simulation) -> list[str]:
    """The burst's keys in a band world (none elsewhere)."""
    return [j.key for j in sim.workload.jobs if j.key.startswith(KEY) and j.key != FITS]


def schedule(sim: Simulation) -> None:
    """Flip-api's aborts of the burst's jobs (never dropped by the broker): once the fitting
    job has ended and every net's idle bound has passed since (so a net the burst's jobs do
    not fit is seen scaled down with them queued), at the latest 250-350 s past the checker's
    `queued-while-free` bound after the fitting job's send (it starves only while a net it
    fits is free)."""
    keys = burst_keys(sim)
    fits = next((j for j in sim.workload.jobs if j.key == FITS), None)
    if not keys or fits is None:
        return
    rng = random.Random(f"{sim.seed}/{STREAM}/abort")
    deadline = fits.arrive_s + sim.bounds.starved + rng.uniform(250.0, 350.0)
    rest = max(sim.bounds.idle.values()) + 30.0
    fits_id = job_id_for(FITS).hex
    ended: list[float] = []  # when the fitting job was first seen ended
    label = f"flip-api aborts the {len(keys)} {SITE} jobs of the long queue"

    def abort() -> None:
        sim.trace(f"== {label}")
        for key in keys:
            payload = {"job_id": str(job_id_for(key)), "reason": "the site-3 queue given up"}
            sim.broker.push(names.ABORT_JOB, {"payload": payload}, origin="flip-api", faulty=False)

    def watch() -> None:
        t = sim.clock.t
        row = sim.conn.execute("SELECT state FROM jobs WHERE id = ?", (fits_id,)).fetchone()
        if not ended and row is not None and JobState(row[0]) in TERMINAL_JOB_STATES:
            ended.append(t)
        if t >= deadline or (ended and t >= ended[0] + rest):
            abort()
            return
        sim.at(t + WATCH_S, f"flip-api looks at {FITS}", watch)

    sim.at(fits.arrive_s + WATCH_S, f"flip-api looks at {FITS}", watch)

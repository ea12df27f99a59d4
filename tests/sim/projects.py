"""Projects (issue 40, fair share): in about half the worlds, on their own stream
(`f"{seed}/projects"`, so every other draw of a seed is unchanged), the jobs belong to two or
three FLIP projects, named by `project_id` or, as FLIP does today, in their metadata; some
worlds weigh a project 2 or cap one at a single net (PROJECT_SHARES), some age jobs after
20 to 90 s (AGING_S, so aging happens within the workload), and half of them add a flood: one
project enqueues 4 to 6 jobs at once, another 1 or 2 a little later, the issue's case in
small. Rarely (EDGE_P of those worlds each, drawn last so every other draw is unchanged), a
setting sits at its bound: AGING_S at its largest (MAX_AGING_S, aging off in effect) or a
project's weight at its smallest (MIN_WEIGHT), where a value past the bound once overflowed
(tests/unit/test_simulation_safeguards.py). The checks are tests.sim.fair_share's."""

from __future__ import annotations

import dataclasses
import json
import random

from app.project_shares import MAX_AGING_S, MIN_WEIGHT
from app.sim.workload import SITES, JobSpec, Workload, WorldSpec

SHARE = 0.5
PROJECTS = ("p-a", "p-b", "p-c")
# The share of the projects' worlds drawing each setting at its bound, and the values drawn
# there (module constants: the safeguards' test draws past them with the bounds removed).
EDGE_P = 0.1
EDGE_AGING_S = MAX_AGING_S
EDGE_WEIGHT = MIN_WEIGHT


def with_projects(seed: int, world: WorldSpec, workload: Workload) -> tuple[WorldSpec, Workload]:
    """The world and workload with projects drawn on the seed's own stream (or as they were)."""
    rng = random.Random(f"{seed}/projects")
    # The upper half of the draw: the seeds the sweep's safeguards were found on
    # (tests/unit/test_simulation_safeguards.py) mostly draw below it and keep their worlds.
    if rng.random() < 1.0 - SHARE:
        return world, workload
    projects = PROJECTS[: rng.randint(2, 3)]
    jobs = [
        dataclasses.replace(
            job,
            project=rng.choice((*projects, None)),
            # FLIP's way (metadata.project_id) only where the job sends no metadata of its
            # own: a hostile one may be at its size limit.
            project_in_metadata=job.metadata is None and rng.random() < 0.4,
        )
        for job in workload.jobs
    ]
    if rng.random() < 0.5:
        jobs += _flood(rng, projects)
    shares: dict[str, dict[str, float | int]] = {}
    if rng.random() < 0.5:
        shares[projects[0]] = {"weight": rng.choice((2, 0.5))}
    if rng.random() < 0.4:
        shares.setdefault(projects[1], {})["max_nets"] = 1
    aging = rng.choice((20.0, 45.0, 90.0)) if rng.random() < 0.4 else None
    if rng.random() < EDGE_P:
        aging = EDGE_AGING_S
    if rng.random() < EDGE_P:
        # The last project: the first may weigh 2 or 0.5 already, the second be capped.
        shares.setdefault(projects[-1], {})["weight"] = EDGE_WEIGHT
    world = dataclasses.replace(
        world, project_shares=json.dumps(shares) if shares else "", aging_s=aging
    )
    return world, dataclasses.replace(workload, jobs=tuple(jobs))


def _flood(rng: random.Random, projects: tuple[str, ...]) -> list[JobSpec]:
    """One project's burst of jobs, then another project's few a little later."""
    first, later = rng.sample(projects, 2)
    start = round(rng.uniform(0, 20), 1)
    flood = [
        JobSpec(
            key=f"flood-{i}",
            arrive_s=start,
            duration_s=round(rng.uniform(15, 40), 1),
            sites=SITES,
            project=first,
        )
        for i in range(rng.randint(4, 6))
    ]
    arrive = round(start + rng.uniform(5, 40), 1)
    flood += [
        JobSpec(
            key=f"late-{i}",
            arrive_s=arrive,
            duration_s=round(rng.uniform(15, 40), 1),
            sites=SITES,
            project=later,
            project_in_metadata=rng.random() < 0.5,
        )
        for i in range(rng.randint(1, 2))
    ]
    return flood

"""A seed's world, workload and fault profile, played with every invariant checked and the
adversary's every moment: what the bug-hunting sweep runs (`run_seed`)."""

from __future__ import annotations

import dataclasses
import random

from app.sim.faults import FaultProfile
from app.sim.report import Result
from app.sim.simulation import Simulation
from app.sim.workload import NetSpec, WorldSpec
from tests.sim import stale_starts
from tests.sim.abort_blip import with_abort_blip
from tests.sim.adversary import Adversary
from tests.sim.flower_faults import with_flower_jobs, with_idle_net
from tests.sim.invariants import Checker
from tests.sim.long_queue import with_long_queue
from tests.sim.prewarms import with_prewarms
from tests.sim.profiles import profile_for_seed
from tests.sim.projects import with_projects
from tests.sim.two_flower import with_two_flower
from tests.sim.worlds import random_workload, random_world

FLOWER_WORLDS = 1 / 3  # the share of worlds with a Flower net


def from_seed(
    seed: int,
    profile: FaultProfile | None = None,
    *,
    tracing: bool = False,
    fail_fast: bool = False,
) -> Simulation:
    """The seed's random world, workload and (unless given) fault profile."""
    profile = profile or profile_for_seed(seed)
    rng = random.Random(f"{seed}/workload")
    world = random_world(rng)
    workload = random_workload(rng, world, abort_p=profile.abort_p, report_p=profile.report_p)
    # Half the worlds run without the awaited-run poll (AWAITED_POLL_S=0, a supported
    # setting): both ways must keep every invariant. Its own generator leaves the world
    # and the workload of every seed as they were before the poll existed.
    poll = random.Random(f"{seed}/queued-poll").choice((0.0, 1.0))
    world = dataclasses.replace(world, awaited_poll_s=poll)
    # A third of the worlds hold a finished run's server for flip-api's results report
    # (RELEASE_AFTER=reported), so reports and aborts meet FINISHING jobs too.
    extra = random.Random(f"{seed}/world-extra")
    if extra.random() < 0.35:
        world = dataclasses.replace(
            world, release_after="reported", report_timeout_s=extra.choice((20.0, 60.0))
        )
    # Where NETS may change, the platform often runs a net NETS declares only later.
    if profile.redeploy_p and extra.random() < 0.5:
        world = dataclasses.replace(world, spare=(NetSpec("net-z", idle_timeout_s=20.0),))
    # Half the worlds declare each net's sites (a job needing site-9 is then refused at
    # enqueue, where the nets' sites are known).
    if extra.random() < 0.5:
        nets = tuple(dataclasses.replace(n, declares_sites=True) for n in world.nets)
        world = dataclasses.replace(world, nets=nets)
    # Most worlds push job status to a callback receiver (app.usecases.callbacks); some
    # start in the middle of a receiver outage thousands of tries long.
    if extra.random() < 0.6:
        world = dataclasses.replace(
            world,
            callbacks=True,
            callback_max_backoff_s=extra.choice((4.0, 8.0, 30.0)),
            receiver_failures_before=1020 if extra.random() < 0.1 else 0,
        )
    if profile.receiver_hang_p:
        # Hangs are on callbacks: every such world pushes them, in reads of three events.
        world = dataclasses.replace(
            world, callbacks=True, callback_events_per_read=3, receiver_failures_before=0
        )
    # A third of the worlds get prewarm hints and cancels at any moment, on a stream of
    # their own (tests.sim.prewarms): the others run exactly as before.
    # (A stale-start band world always has them: its own hints are read as theirs.)
    always = stale_starts.in_bands(seed) and not profile.clean
    world, workload = with_prewarms(seed, world, workload, always=always)
    world = with_flower(seed, world)
    # A rare band of its own stream: two Flower nets and two jobs pinned to them (round 13,
    # tests.sim.two_flower; every other world as before).
    world, workload = with_two_flower(seed, world, workload)
    # IDLE's worlds (their own band of the Flower faults' first draw): the Flower net
    # always-on, RELEASE_AFTER=finished (tests.sim.flower_faults).
    world = with_idle_net(seed, world, profile)
    # About half the worlds' jobs belong to projects (issue 40), on a stream of their own.
    world, workload = with_projects(seed, world, workload)
    # Worlds with a Flower net may get a job of a malformed Flower App, and one pinned to
    # the net behind a fault that never ends (their own stream, the last jobs: every other
    # job's draws as before; tests.sim.flower_faults).
    workload = with_flower_jobs(seed, world, profile, workload)
    # A rare band of its own stream: a burst of 55-60 jobs for one net's own site, then one
    # any net may run (round 20, tests.sim.long_queue; every other world as before).
    world, workload = with_long_queue(seed, world, workload)
    # A rare band of its own stream: one more job, sent once faults stopped, whose abort
    # meets one error or a lost submit reply (round 22, tests.sim.abort_blip).
    world, workload = with_abort_blip(seed, world, workload)
    sim = Simulation(
        world,
        workload,
        profile,
        seed,
        checker=Checker(),
        adversary=Adversary(),
        tracing=tracing,
        fail_fast=fail_fast,
    )
    for net in world.nets:
        if net.backend == "flower":
            state = "a state database" if net.keeps_jobs else "its state in memory"
            sim.trace(f"   {net.name} is a Flower net: a SuperLink with {state}")
    return sim


def with_flower(seed: int, world: WorldSpec) -> WorldSpec:
    """About a third of the worlds make one of their nets a Flower net (issue 38: its server
    a SuperLink, app.sim.superlink; its client the Flower adapter's, app.sim.flower_admin),
    drawn on a stream of its own: every other world runs exactly as before."""
    rng = random.Random(f"{seed}/backend")
    if rng.random() >= FLOWER_WORLDS:
        return world
    pick = rng.randrange(len(world.nets))
    nets = tuple(
        dataclasses.replace(n, backend="flower") if i == pick else n
        for i, n in enumerate(world.nets)
    )
    return dataclasses.replace(world, nets=nets)


def replay_command(seed: int) -> str:
    """The one line that replays a seed with its trace."""
    return f"SIM_SEED={seed} .venv/bin/python -m pytest tests/unit/test_simulation.py -k replay -s"


def run_seed(
    seed: int,
    profile: FaultProfile | None = None,
    *,
    tracing: bool = False,
    fail_fast: bool = False,
) -> Result:
    """One seed, from scratch (fail_fast: stop at the first violation)."""
    result = from_seed(seed, profile, tracing=tracing, fail_fast=fail_fast).run()
    result.replay = replay_command(seed)
    return result

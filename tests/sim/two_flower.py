"""Worlds with two Flower nets (round 13): in a band of the first draw of `f"{seed}/two-flower"`
(about 4% of the worlds; none of the seeds the safeguards and the sweep-seed tests name falls
in it, and no other stream is drawn, so every other world replays exactly), two of the
world's nets are Flower nets (the one `seeds.with_flower` made, if any, and another), finished
runs are held for flip-api's results report (RELEASE_AFTER=reported, REPORT_TIMEOUT_S 60),
and two jobs are added, sent together: a short one pinned to one Flower net (`SHORT_KEY`) and
a long one pinned to the other (`LONG_KEY`), so the short job waits FINISHING while the long
one's run lives on the other SuperLink.

There `tests.sim.kits` draws a spell of its own (`kits.plan`): the first net's certificate
names the other net's SuperLink, which answers as its own, landing the moment a job of the
first net is FINISHING while the other SuperLink holds a live run (`moment`). The monitor's
stop of uncounted runs on a FINISHING Flower net (`revived_runs.stop_uncounted_on`) lists and
stops every run it reaches that the net's job does not count: through those files, the other
net's job's run (tests/sim/FINDINGS.md, "Round 13")."""

from __future__ import annotations

import dataclasses
import random

from app.sim import superlink
from app.sim.simulation import Simulation
from app.sim.workload import JobSpec, Workload, WorldSpec

# The first draw's values that give a world two Flower nets: a band none of the named seeds'
# draws falls in (tests/unit/test_simulation_*safeguards.py, test_sweep_seeds.py).
BAND = (0.672, 0.712)
SHORT_KEY = "two-flower-short"  # pinned to the net whose kit will name the other SuperLink
LONG_KEY = "two-flower-long"  # pinned to the other Flower net, running while the short waits
REPORT_TIMEOUT_S = 60.0  # the longest of the sweep's: the FINISHING wait the spell lands in
MOMENT = "FINISHING-BESIDE-A-RUN"  # the trigger's state (app.sim.caller)


def with_two_flower(seed: int, world: WorldSpec, workload: Workload) -> tuple[WorldSpec, Workload]:
    """The world with two Flower nets and the two pinned jobs, in the band (else unchanged)."""
    rng = random.Random(f"{seed}/two-flower")
    if not BAND[0] <= rng.random() < BAND[1]:
        return world, workload
    flower = [n.name for n in world.nets if n.backend == "flower"]
    others = [n.name for n in world.nets if n.backend != "flower"]
    while len(flower) < 2:  # a world has 2-4 nets, at most one Flower net so far
        flower.append(others.pop(rng.randrange(len(others))))
    rng.shuffle(flower)
    short_net, long_net = flower[:2]
    nets = tuple(
        dataclasses.replace(n, backend="flower") if n.name in (short_net, long_net) else n
        for n in world.nets
    )
    world = dataclasses.replace(
        world, nets=nets, release_after="reported", report_timeout_s=REPORT_TIMEOUT_S
    )
    arrive = round(rng.uniform(10.0, 60.0), 1)
    short = JobSpec(
        key=SHORT_KEY, arrive_s=arrive, duration_s=round(rng.uniform(15.0, 25.0), 1), net=short_net
    )
    long = JobSpec(
        key=LONG_KEY, arrive_s=arrive, duration_s=round(rng.uniform(90.0, 110.0), 1), net=long_net
    )
    return world, dataclasses.replace(workload, jobs=(*workload.jobs, long, short))


def pair(workload: Workload) -> tuple[str, str] | None:
    """(the net whose kit will name the other's SuperLink, that other net), or None: not a
    world of the band."""
    nets = {job.key: job.net for job in workload.jobs if job.key in (SHORT_KEY, LONG_KEY)}
    short, long = nets.get(SHORT_KEY), nets.get(LONG_KEY)
    return None if short is None or long is None else (short, long)


def moment(sim: Simulation, net: str, other: str) -> str:
    """`MOMENT` while a job of `net` is FINISHING and `other`'s SuperLink holds a live run
    (one `net`'s job does not count), else ""."""
    finishing = sim.conn.execute(
        "SELECT 1 FROM jobs WHERE net_name = ? AND state = 'FINISHING'", (net,)
    ).fetchone()
    server = sim.cluster.servers.get(other)
    if finishing is None or not isinstance(server, superlink.SuperLink):
        return ""
    t = sim.clock.t
    live = any(superlink.record(run, t)[0] != superlink.FINISHED for run in server.store.values())
    return MOMENT if live else ""

"""Redeploys while jobs run: an operator changes NETS (a net removed or added back, one net
switched between scale-to-zero and always-on, its timeouts changed) and restarts the
workers with the new settings. The platform itself does not change: a removed net's server
runs on, a net added back finds whatever its server still holds.

The moment is the adversary's: a net is removed, preferably, while a job is active on it.
"""

from __future__ import annotations

import dataclasses
import functools
import random

from app.sim.simulation import Simulation

KINDS = ("remove", "remove", "add", "flip", "timeouts")


def plan(sim: Simulation, rng: random.Random, p: float) -> None:
    """Schedule 0 to 2 redeploys within the workload's horizon."""
    horizon = sim.workload.horizon_s
    count = 0
    while count < 2 and rng.random() < p:
        count += 1
        at = rng.uniform(20.0, horizon - 10.0)
        kind = rng.choice(KINDS)
        choice = rng.random()
        sim.at(at, f"redeploy ({kind})", functools.partial(redeploy, sim, kind, choice))


def _active_nets(sim: Simulation) -> list[str]:
    return [
        str(r[0])
        for r in sim.conn.execute(
            "SELECT DISTINCT net_name FROM jobs WHERE net_name IS NOT NULL AND state IN"
            " ('ASSIGNED', 'DISPATCHING', 'RUNNING', 'FINISHING', 'ABORTING') ORDER BY net_name"
        )
    ]


def redeploy(sim: Simulation, kind: str, choice: float) -> None:
    """Change NETS as `kind` says (`choice` in [0, 1) picks the net), then restart."""
    declared = sim.declared
    names = declared.names()
    every = {n.name: n for n in (*sim.world.nets, *sim.world.spare)}
    note = ""
    if kind == "remove" and len(names) > 1:
        busy = [n for n in _active_nets(sim) if n in names]
        pool = busy if busy and choice < 0.7 else names
        gone = pool[int(choice * len(pool)) % len(pool)]
        declared.nets = [n for n in declared.nets if n.name != gone]
        note = f"{gone} removed from NETS"
    elif kind == "add" or (kind == "remove" and len(names) <= 1):
        missing = [n for n in every if n not in names]
        if not missing:
            return
        back = missing[int(choice * len(missing))]
        declared.nets.append(every[back])
        note = f"{back} added to NETS"
    elif kind == "flip":
        scalable = [n for n in declared.nets if n.kind == "ecs"]
        if not scalable:
            return
        net = scalable[int(choice * len(scalable))]
        now_always_on = not sim.scales_to_zero(net.name)
        declared.per_job[net.name] = now_always_on  # the other way round
        note = f"{net.name}: per_job_fl_server={now_always_on}"
    else:
        net = declared.nets[int(choice * len(declared.nets))]
        changed = dataclasses.replace(
            net,
            idle_timeout_s=float(random.Random(choice).choice((0, 20, 45))),
            ready_timeout_s=float(random.Random(choice).choice((30, 60))),
        )
        declared.nets = [changed if n.name == net.name else n for n in declared.nets]
        note = (
            f"{net.name}: idle {changed.idle_timeout_s:.0f}s, ready {changed.ready_timeout_s:.0f}s"
        )
    sim.apply_settings(f"redeploy: {note}")

"""An operator's drain (issue 40, app/usecases/drains.py): in about one world in seven, on
its own stream (`f"{seed}/drain"`, so the other draws of a seed are unchanged), an operator
drains one net or the whole deployment for a while, as `fl-dispatcher drain` does, and
undrains it before the workload's horizon (`undrain`, which kicks the assigner).

`claim-onto-drained-net` (every step): no job is claimed onto a net that was drained at the
step before (a drain commits before any later claim reads, and a claim that raced it
committed first, so was seen before the drain). The drained net's queue waiting is not
`queued-while-free` (tests.sim.invariants: a drained net is not free), and its server is not
kept up for that queue (`idle-net-at-zero`: app.sim.state.WorldState.needed)."""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from app.errors import InvalidRequest
from app.runtime import Runtime
from app.sim.simulation import Simulation
from app.usecases import drains
from models import ACTIVE_JOB_STATES

if TYPE_CHECKING:
    from tests.sim.observer import Observer

SHARE = 0.15


def schedule(sim: Simulation) -> None:
    """Draw the world's drain, if any, and schedule it and its undrain."""
    rng = random.Random(f"{sim.seed}/drain")
    if rng.random() >= SHARE:
        return
    horizon = sim.workload.horizon_s
    start = rng.uniform(5.0, max(6.0, horizon - 40.0))
    end = min(horizon, start + rng.uniform(20.0, 120.0))
    everything = rng.random() < 0.4
    nets: tuple[str, ...] = () if everything else (rng.choice([n.name for n in sim.world.nets]),)
    what = "the whole deployment" if everything else nets[0]
    sim.at(
        start, f"operator drains {what}", functools.partial(operator_drain, sim, nets, everything)
    )
    sim.at(
        end, f"operator undrains {what}", functools.partial(operator_undrain, sim, nets, everything)
    )


def _operator(sim: Simulation) -> Runtime:
    """The CLI's runtime: the deployment's settings, the plain sessions, a kick to the broker."""
    return dataclasses.replace(sim.workers[0], sessions=sim.sessions, clock=sim.clock)


def operator_drain(sim: Simulation, nets: tuple[str, ...], everything: bool) -> None:
    try:
        view = drains.drain(_operator(sim), nets, everything=everything, reason="sim")
    except InvalidRequest as exc:  # a redeploy removed the net meanwhile: the CLI says so
        sim.trace(f"   drain refused: {exc}")
        return
    except SQLAlchemyError:  # a simulated database fault: the operator runs it again
        _again(sim, "drain", functools.partial(operator_drain, sim, nets, everything))
        return
    sim.trace(f"== drained {', '.join(n.name for n in view.nets)}: {view.state}")


def operator_undrain(sim: Simulation, nets: tuple[str, ...], everything: bool) -> None:
    try:
        view = drains.undrain(_operator(sim), nets, everything=everything)
    except InvalidRequest as exc:
        sim.trace(f"   undrain refused: {exc}")
        return
    except SQLAlchemyError:
        _again(sim, "undrain", functools.partial(operator_undrain, sim, nets, everything))
        return
    sim.trace(f"== undrained ({view.state}), assigner told: {view.notified}")


def _again(sim: Simulation, what: str, action: functools.partial[None]) -> None:
    sim.trace(f"   {what} failed on a database error: the operator runs it again in 5 s")
    sim.at(sim.clock.t + 5.0, f"operator {what}s again", action)


def check(observer: Observer) -> None:
    """`claim-onto-drained-net`, after one step: a job active on a net now that was not
    active at the step before (a claim) while that net was drained at the step before."""
    for job in observer.jobs:
        if job.state not in ACTIVE_JOB_STATES or job.net is None:
            continue
        if job.id not in observer._active_before and job.net in observer._drained_before:
            observer.report(
                "claim-onto-drained-net",
                f"job {job.id[:8]}",
                f"claimed onto net {job.net} (attempt {job.attempt}), drained at the step before",
            )
    observer._active_before = {j.id for j in observer.jobs if j.state in ACTIVE_JOB_STATES}
    observer._drained_before = {n.name for n in observer.nets if n.drained}

"""Bursts (the sweep's prewarm worlds that draw one, tests.sim.prewarms): from its time on,
the moment two READY nets are free (declared, no active job, no stray run) and held by no
open prewarm, flip-api sends a hint for one of them, then a more urgent job that names no
hint, then the job that names the hint, so both wait at the same claim. The claim must give
the unheld READY net to the plain job and leave the held one to the hinted job (tasks/README.md
"Prewarm": `held-net-taken`, tests.sim.placement); a claim that put the held net first for
any job naming it gave it to the plain job (a4b8e22). Dropped at the horizon if the moment
never comes (the two jobs are then never sent)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from app import names
from app.sim.simulation import Simulation
from app.sim.workload import BurstSpec, JobSpec

TWO = "TWO"  # the trigger's state (app.sim.caller): two READY nets free and unheld

Arm = Callable[[Callable[[], str], str, str, Callable[[], None]], None]
Payload = Callable[[JobSpec], dict[str, object]]


def free_ready(sim: Simulation) -> list[str]:
    """The READY nets free (as a claim reads them) and held by no open prewarm."""
    rows = sim.conn.execute(
        "SELECT n.name FROM nets n WHERE n.state = 'READY' AND NOT EXISTS (SELECT 1 FROM jobs j"
        " WHERE j.net_name = n.name AND j.state IN"
        " ('ASSIGNED', 'DISPATCHING', 'RUNNING', 'FINISHING', 'ABORTING'))"
        " AND NOT EXISTS (SELECT 1 FROM stray_runs s WHERE s.net_name = n.name)"
        " AND NOT EXISTS (SELECT 1 FROM prewarms p WHERE p.net_name = n.name"
        " AND p.outcome IS NULL) ORDER BY n.name"
    ).fetchall()
    return [name for (name,) in rows if sim.settings.has_net(name)]


def state(sim: Simulation) -> str:
    return TWO if len(free_ready(sim)) >= 2 else ""


def schedule(sim: Simulation, arm: Arm, payload: Payload) -> None:
    for burst in sim.workload.bursts:
        send = _sender(sim, burst, payload)
        label = f"burst {burst.key}: flip-api sends {burst.plain} and {burst.hinted}"
        sim.at(
            burst.at_s,
            f"{label} once two READY nets are free",
            partial(arm, partial(state, sim), TWO, label, send),
        )


def _sender(sim: Simulation, burst: BurstSpec, payload: Payload) -> Callable[[], None]:
    jobs = {j.key: j for j in sim.workload.jobs}

    def send() -> None:
        nets = free_ready(sim)
        if len(nets) < 2:
            return
        net = nets[int(burst.pick * len(nets))]
        hint = {"caller_key": burst.key, "within_s": burst.within_s, "required_sites": []}
        hint["net"] = net
        sim.trace(f"== flip-api prewarms {net} for {burst.hinted}, then sends {burst.plain}")
        sim.broker.push(names.PREWARM, {"payload": hint}, origin="flip-api")
        for key in (burst.plain, burst.hinted):
            sim.broker.push(names.ENQUEUE_JOB, {"payload": payload(jobs[key])}, origin="flip-api")

    return send

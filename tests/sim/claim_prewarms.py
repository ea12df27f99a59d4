"""Prewarms at the instant of a claim: in half the sweep's worlds with prewarms (a stream of
their own, `f"{seed}/claim-prewarm"`: the other worlds run as before), flip-api sends a hint for
the net one or two jobs are claimed onto at the very moment of the claim, and the other
worker takes it at once, so the hint's row has the claim's timestamp but comes after it.
A claim ends only the holds open when it is made; a hint made after it holds the net for
the next job, to its own end (`prewarm-used-by-later-claim`, tests.sim.prewarm_invariants)."""

from __future__ import annotations

import random
from collections.abc import Callable

from app import names
from app.schemas import job_id_for
from app.sim.simulation import Simulation

CLAIM_PREWARM_SHARE = 0.5  # the share of the worlds with prewarms that draw these

Arm = Callable[[str, str, str, Callable[[], None]], None]


def schedule(sim: Simulation, arm: Arm) -> None:
    """Arm the hints (each sent once, at its job's first claim before the horizon)."""
    jobs = sim.workload.jobs
    if not sim.workload.prewarms or not jobs:
        return
    rng = random.Random(f"{sim.seed}/claim-prewarm")
    if rng.random() >= CLAIM_PREWARM_SHARE:
        return
    for i in range(rng.randint(1, 2)):
        job = rng.choice(jobs)
        within = float(rng.choice((20, 60, 300)))
        send = _sender(sim, str(job_id_for(job.key)), f"pw-claim-{i}", within)
        arm(
            str(job_id_for(job.key)), "ASSIGNED", f"flip-api prewarms as {job.key} is claimed", send
        )


def _sender(sim: Simulation, job_id: str, key: str, within: float) -> Callable[[], None]:
    def send() -> None:
        if sim.draining:
            return  # the caller's hints stop at the horizon
        row = sim.conn.execute(
            "SELECT net_name FROM jobs WHERE id = ?", (job_id.replace("-", ""),)
        ).fetchone()
        if row is None or row[0] is None:
            return
        payload = {"caller_key": key, "within_s": within, "required_sites": [], "net": row[0]}
        sim.broker.push(names.PREWARM, {"payload": payload}, origin="flip-api")
        _take_now(sim, key)

    return send


def _take_now(sim: Simulation, key: str) -> None:
    """The other worker runs the hint now, at the claim's instant (unless the broker lost or
    delayed it, or both workers are busy: then it waits its turn like any message)."""
    free = {0, 1} - set(sim.running) - {sim.stalled}
    if len(sim.running) > 1 or not free:
        return
    message = next(
        (
            m
            for m in sim.broker.due(sim.clock.t)
            if m.task == names.PREWARM and m.kwargs["payload"].get("caller_key") == key
        ),
        None,
    )
    if message is None:
        return
    slot = min(free)
    sim.broker.take(message)
    if sim.tracing:
        sim.trace(f"   || w{slot} runs {message.label()} at the claim's instant")
    sim.deliver(message, slot)

"""A repeat after a redeploy (round 4's fix 11): flip-api sends one job's enqueue again, the
very payload it sent first, after an operator's redeploy lowered MAX_ATTEMPTS. The job
left max_attempts out, so the stored request was filled with the old default: an identical
retry is the same request (README, caller_key: "flip-api's own retry gets its job back"),
whatever a redeploy changed since. The code before the fix compared the stored digest with
one filled from today's default and refused the retry as `caller_key_conflict`.

In about one world in seven of the profiles that redeploy (their own stream,
`f"{seed}/repeat"`, so the other draws of a seed are unchanged), armed from the job's
arrival for the moment its row is stored; dropped at the horizon if that never comes.

`repeat-refused` (at the end of a run): no caller_key of the workload's jobs, each of which
flip-api only ever sends with one payload, is refused as another payload
("enqueued with a different payload")."""

from __future__ import annotations

import dataclasses
import functools
import random

from app import names
from app.schemas import job_id_for
from app.sim.simulation import Simulation
from app.sim.workload import JobSpec
from tests.sim.bursts import Arm

SHARE = 0.15
STORED = "STORED"  # the trigger's state (app.sim.caller): the job's row exists
CONFLICT_TEXT = "enqueued with a different payload"  # enqueue._repeat's CallerKeyConflict


def schedule(sim: Simulation, arm: Arm) -> None:
    """Draw the world's repeat, if any, and arm it."""
    rng = random.Random(f"{sim.seed}/repeat")
    if not sim.profile.redeploy_p or rng.random() >= SHARE or sim.world.max_attempts < 2:
        return
    later = {k for b in sim.workload.bursts for k in (b.plain, b.hinted)}
    jobs = [j for j in sim.workload.jobs if j.max_attempts is None and j.key not in later]
    if not jobs:
        return
    job = rng.choice(jobs)
    lowered = rng.randint(1, sim.world.max_attempts - 1)
    label = f"redeploy: MAX_ATTEMPTS {sim.world.max_attempts} -> {lowered}, then {job.key} again"

    def send() -> None:  # at the next event round: a redeploy restarts the workers
        sim.at(sim.clock.t, label, functools.partial(_repeat, sim, job, lowered))

    stored = functools.partial(_stored, sim, str(job_id_for(job.key)).replace("-", ""))
    sim.at(
        job.arrive_s, f"{label}, once stored", functools.partial(arm, stored, STORED, label, send)
    )


def _stored(sim: Simulation, job_hex: str) -> str:
    row = sim.conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_hex,)).fetchone()
    return STORED if row is not None else ""


def _repeat(sim: Simulation, job: JobSpec, lowered: int) -> None:
    """The redeploy (every worker restarted with the new default), then flip-api's retry."""
    sim.world = dataclasses.replace(sim.world, max_attempts=lowered)
    sim.apply_settings(f"MAX_ATTEMPTS={lowered}")
    payload = sim.caller.enqueue_payload(job)
    sim.trace(f"== flip-api sends {job.key} again, as it sent it first")
    sim.broker.push(names.ENQUEUE_JOB, {"payload": payload}, origin="flip-api")


def repeat_refused(sim: Simulation, sent: frozenset[str] = frozenset()) -> None:
    """No workload job's key was refused as another payload (flip-api never sends one, but
    for the refused payloads whose digests are `sent`: tests.sim.refusal_repeat's)."""
    keys = {j.key for j in sim.workload.jobs}
    for key, reason, digest in sim.conn.execute(
        "SELECT caller_key, reason, payload_digest FROM rejected_requests WHERE reason_code = ?",
        ("caller_key_conflict",),
    ):
        if key in keys and CONFLICT_TEXT in (reason or "") and digest not in sent:
            sim.report("repeat-refused", f"caller_key {key[:40]}", (reason or "")[:300])

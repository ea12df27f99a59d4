"""A start a redeploy to always-on leaves behind (round 14's break-it, fixed in 2ea0f47): in
bands of the first draw of `f"{seed}/left-start"` (about 13% of the worlds with an adversary
but the clean profile's, none of the safeguards' and sweep-seed tests' seeds in them, so
every other world replays exactly), the moment a scale-to-zero ECS net is STARTING with no
replica asked for yet (in a world with prewarms, a hint's start before its warm_up; else a
claim's before its scale_up), a redeploy makes it always-on, the operator's deploy leaving
the service's desired count alone (Terraform's ignore_changes: `Operator.keeps_count`), and
flip-api aborts the job that holds it, if any, at once, before its scale_up: a job-less
always-on STARTING net at zero replicas, which only `watch_always_on` brings up
(`always-on-replica`, tests.sim.always_on_starts).

In two worlds of three the new replica's admin port is cut off for 90-240 s, past the net's
readiness deadline: the start goes OUTAGE (`outages.overdue_start`) and comes back READY
through `_back_up`, idle from its holds' end (`idle-from-hold-end` on OUTAGE -> READY,
tests.sim.ready_invariants). At a hint's start the operator also drains the net 5-40 s later
(`drains.drain`, which ends its holds then and keeps claims off it) until 30-90 s after the
cut-off: a job claimed onto the start would need the server past the holds."""

from __future__ import annotations

import dataclasses
import functools
import random
import uuid

from sqlalchemy.exc import SQLAlchemyError

from app import names
from app.sim.simulation import Simulation
from app.usecases import intake
from tests.sim import drains

# The first draw's values that give a world the moment: bands none of the named seeds'
# draws falls in (tests/unit/test_simulation_*safeguards.py, test_sweep_seeds.py).
BANDS = ((0.093, 0.126), (0.149, 0.172), (0.613, 0.639), (0.849, 0.892))
CUT_OFF_P = 2 / 3


class LeftStart:
    """The moment, once per world, looked for after every step until the horizon."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        rng = random.Random(f"{sim.seed}/left-start")
        first = rng.random()
        self.armed = not sim.profile.clean and any(lo <= first < hi for lo, hi in BANDS)
        cut_off = rng.uniform(90.0, 240.0)
        self._cut_off = cut_off if rng.random() < CUT_OFF_P else None
        self._undrain_after = rng.uniform(30.0, 90.0)
        self._drain_after = rng.uniform(5.0, 40.0)
        # Where flip-api sends hints, the moment waits for a hint's start (no job holds it).
        self._hinted = bool(sim.workload.prewarms)

    def after_step(self) -> None:
        if not self.armed:
            return
        sim = self.sim
        if sim.draining:
            self.armed = False
            return
        for (name,) in sim.conn.execute("SELECT name FROM nets WHERE state = 'STARTING'"):
            spec = next((n for n in sim.declared.nets if n.name == name), None)
            driver = sim.cluster.drivers.get(name)
            if spec is None or spec.kind != "ecs" or driver is None or driver.desired:
                continue
            if not sim.scales_to_zero(name):
                continue
            holders = sim.conn.execute(
                "SELECT id, state FROM jobs WHERE net_name = ? AND state IN ('ASSIGNED',"
                " 'DISPATCHING', 'RUNNING', 'FINISHING', 'ABORTING')",
                (name,),
            ).fetchall()
            if any(state != "ASSIGNED" for _, state in holders) or (holders and self._hinted):
                continue
            self.armed = False
            self._fire(name, [str(uuid.UUID(hex=str(h[0]).replace("-", ""))) for h in holders])
            return

    def _fire(self, name: str, jobs: list[str]) -> None:
        sim = self.sim
        sim.trace(f"== {name} STARTING at 0 replicas: a redeploy makes it always-on")
        sim.operator.keeps_count = True
        sim.declared.per_job[name] = False
        sim.apply_settings(f"redeploy: {name}: per_job_fl_server=False (at its start)")
        for job_id in jobs:
            self._abort(job_id)
        if self._cut_off is None:
            return
        t = sim.clock.t
        sim.trace(f"   {name}'s new replica cut off for {self._cut_off:.0f}s")
        sim.cluster.servers[name].partition(t, t + self._cut_off)
        if not jobs:
            sim.at(
                t + self._drain_after,
                f"operator drains {name}",
                functools.partial(drains.operator_drain, sim, (name,), False),
            )
            sim.at(
                t + self._cut_off + self._undrain_after,
                f"operator undrains {name}",
                functools.partial(drains.operator_undrain, sim, (name,), False),
            )

    def _abort(self, job_id: str) -> None:
        """flip-api's abort, run at once by a worker (before the chain's scale_up)."""
        sim = self.sim
        rt = dataclasses.replace(sim.workers[0], sessions=sim.sessions, clock=sim.clock)
        sim.trace(f"   flip-api aborts job {job_id[:8]} at once")
        try:
            intake.request_abort(rt, uuid.UUID(job_id), "aborted by the user")
        except SQLAlchemyError:  # a simulated database fault: the call is sent as a message
            payload: dict[str, object] = {"job_id": job_id, "reason": "aborted by the user"}
            sim.caller.sender(names.ABORT_JOB, payload)()

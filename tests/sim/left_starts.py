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

In two worlds of three the new replica's admin port is cut off from then until 90-240 s
after the driver takes the first ask for it (the readiness deadline, ready_timeout_s = 50 s,
counts from that ask since round 15: `outages.overdue_start`), so 40-190 s past the
deadline: the start goes OUTAGE and comes back READY through `_back_up`, idle from its
holds' end (`idle-from-hold-end` on OUTAGE -> READY, tests.sim.ready_invariants); the world
may not end at rest before the net could be back (an OUTAGE is at rest). At a hint's start
the operator also drains the net 2-5 s later, 32-35 s where clocks may be stepped (the
checker's slack: a hold ending within it of the start did not clearly want it), which ends
its holds then and keeps claims off it (`drains.drain`), until 30-90 s after the cut-off:
a job claimed onto the start idles the net from its own end, not the holds'. Only such
hinted starts can find `_back_up` idling from now; the hint's job, often claimed within
seconds, still keeps most of them from it (crashy 776, 821, 830, racy 525 and 4 more of
0-1200's 74 cut-off worlds find it; 13 of 1201-5000's 283)."""

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
from tests.sim.ready_invariants import CLOCK_STEP_S

# The first draw's values that give a world the moment: bands none of the named seeds'
# draws falls in (tests/unit/test_simulation_*safeguards.py, test_sweep_seeds.py).
BANDS = ((0.093, 0.126), (0.149, 0.172), (0.613, 0.639), (0.849, 0.892))
CUT_OFF_P = 2 / 3
WATCH_S = 120.0  # past the undrain: rounds enough to see the net back up and idle


class LeftStart:
    """The moment, once per world, looked for after every step until the horizon."""

    STREAM = "left-start"  # the world's stream: its first draw picks the worlds (`BANDS`)

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        rng = random.Random(f"{sim.seed}/{self.STREAM}")
        first = rng.random()
        self.armed = not sim.profile.clean and self._in_bands(first)
        # The cut-off counts from the first ask for the replica (the readiness deadline's
        # start, `outages.overdue_start`): 90-240 s is ready_timeout_s (50 s) + 40-190 s.
        cut_off = rng.uniform(90.0, 240.0)
        self._cut_off = cut_off if rng.random() < CUT_OFF_P else None
        self._undrain_after = rng.uniform(30.0, 90.0)
        # The drain comes 2-5 s after the start, mostly before the hint's job is claimed onto
        # it (a claimed start idles from its job, not its holds), and past the checker's
        # slack where clocks may be stepped: a hold that ends within it of the start did not
        # clearly want it (tests.sim.ready_invariants), so OUTAGE -> READY went unchecked.
        # (Same draws as before, only their values moved: other worlds replay exactly.)
        slack = CLOCK_STEP_S if sim.profile.clock_step_p else 0.0
        self._drain_after = slack + rng.uniform(2.0, 5.0)
        # Where flip-api sends hints, the moment waits for a hint's start (no job holds it).
        self._hinted = bool(sim.workload.prewarms)
        self._left: tuple[str, float] | None = None  # the net and when it was left, till its ask

    def _in_bands(self, first: float) -> bool:
        """The world has the moment (its stream's first draw in a band)."""
        return any(lo <= first < hi for lo, hi in BANDS)

    def after_step(self) -> None:
        if self._left is not None:
            self._cut_off_from_ask()
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
        self._left_behind(name, jobs)

    def _left_behind(self, name: str, jobs: list[str]) -> None:
        """What befalls the left start: its replica cut off (two worlds in three)."""
        sim = self.sim
        if self._cut_off is None:
            return
        t = sim.clock.t
        sim.trace(f"   {name}'s new replica cut off for {self._cut_off:.0f}s from its ask")
        # Cut off from now (a world whose ask never comes, its driver broken, as before), and
        # from the ask on once the driver takes it (`_cut_off_from_ask`).
        sim.cluster.servers[name].partition(t, t + self._cut_off)
        self._watch_until(t + self._cut_off)
        self._left = (name, t)
        if not jobs:
            sim.at(
                t + self._drain_after,
                f"operator drains {name}",
                functools.partial(drains.operator_drain, sim, (name,), False),
            )
            sim.at(
                t + self._cut_off + self._undrain_after,
                f"operator undrains {name} once its cut-off is over",
                functools.partial(self._undrain, name),
            )

    def _cut_off_from_ask(self) -> None:
        """Once the driver takes the first scale-up since the net was left at zero, the cut-off
        runs from then: the start's readiness deadline counts from that ask, and the replica
        must stay cut off past it for the start to go OUTAGE."""
        assert self._left is not None and self._cut_off is not None
        name, left_at = self._left
        asked = [t for t in self.sim.cluster.drivers[name].asks if t >= left_at]
        if not asked:
            return
        self._left = None
        end = asked[0] + self._cut_off
        self.sim.trace(
            f"   {name}'s replica asked for at {asked[0]:.1f}s: cut off until {end:.0f}s"
        )
        self.sim.cluster.servers[name].partition(asked[0], end)
        self._watch_until(end)

    def _watch_until(self, end: float) -> None:
        """The world may end at rest only once the net could be back up and undrained: an
        OUTAGE is at rest, so its READY (and the check on it) would often come too late."""
        sim = self.sim
        sim.rest_not_before = max(sim.rest_not_before, end + self._undrain_after + WATCH_S)

    def _undrain(self, name: str) -> None:
        """The operator undrains 30-90 s after the cut-off, as it ends once its ask is known."""
        sim = self.sim
        at = sim.cluster.servers[name].partition_until + self._undrain_after
        if at > sim.clock.t:
            again = functools.partial(self._undrain, name)
            sim.at(at, f"operator undrains {name} once its cut-off is over", again)
            return
        drains.operator_undrain(sim, (name,), False)

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

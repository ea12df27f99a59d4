"""`start-never-outage`: an always-on net STARTING with no job, past its readiness deadline
(the net's ready_timeout_s from its STARTING, app.usecases.outages) and a reconcile round, is
READY (its server answered: `net_repairs._ready_once_ready`) or OUTAGE (it did not), never
STARTING for ever: an operator pages on OUTAGE, and a server that never comes up must page.
Before the fix the always-on watch skipped STARTING, so such a net stayed STARTING until a
job was claimed onto it and that job's own readiness deadline marked it. A net holding a job
is that job's chain's (its ASSIGNED is bounded by `job-state-bounded`); the wait counts from
the latest of the net's STARTING + its deadline, its job letting go, and a redeploy that
made it always-on or changed its deadline."""

from __future__ import annotations

from app.sim.simulation import Simulation
from models import ACTIVE_JOB_STATES, NetState
from tests.sim.observer import Observer

# How far a product's clock may be from the simulation's where clocks are stepped
# (tests.sim.ready_invariants.CLOCK_STEP_S): the STARTING's stamp and the round's read.
CLOCK_STEP_S = 30.0


class AlwaysOnStarts(Observer):
    """`start-never-outage`, from the round's read of nets and jobs after every step."""

    def start(self, sim: Simulation) -> None:
        super().start(sim)
        # net -> ((its STARTING's stamp, its deadline), when it was first seen so)
        self._jobless_start: dict[str, tuple[tuple[float, float], float]] = {}
        self._start_slack = 2 * CLOCK_STEP_S if sim.profile.clock_step_p else 1.0

    def _always_on_starts(self, t: float) -> None:
        sim = self.sim
        held = {j.net for j in self.jobs if j.state in ACTIVE_JOB_STATES}
        reconcile = 2 * sim.world.housekeeping_interval_s
        for net in self.nets:
            name = net.name
            if (
                net.state != NetState.STARTING
                or name in held
                or not sim.declared_net(name)
                or sim.scales_to_zero(name)
            ):
                self._jobless_start.pop(name, None)
                continue
            timeout_s = sim.settings.net(name).ready_timeout_s
            key = (net.changed_s, timeout_s)
            seen = self._jobless_start.get(name)
            if seen is None or seen[0] != key:
                seen = self._jobless_start[name] = (key, t)
            due = max(seen[1], net.changed_s + timeout_s)
            # The broker down meanwhile delivers no beat tick, so no round can end the wait.
            due = self._after_broker_outages(due, t)
            bound = reconcile + self.bounds.unaccounted + self._start_slack
            if t - due > bound:
                self.report(
                    "start-never-outage",
                    f"net {name}",
                    f"always-on, STARTING with no job for {t - net.changed_s:.0f}s (deadline "
                    f"{timeout_s:.0f}s + {bound:.0f}s): neither READY nor OUTAGE",
                )

"""MISFIT (round 12): a Flower net's settling start finds the net's settings wrong, then a
human mends them and restarts the workers. Drawn in a band of `tests.sim.flower_faults`'
first draw (`MISFIT_BAND`: every earlier seed replays exactly) on a scale-to-zero net with a
state database: the crash at a start-run (every one, until faults stop: round 14's seed 6684,
tests.sim.flower_faults) leaves a stray its SuperLink keeps, the net is
started to settle it, and at that start's scale call its admin kit breaks (AdminMisconfigured
at readiness: the CA no longer matches) or its service goes missing (MisconfigurationError
at the scale): the net is MISCONFIGURED. `misfit_fix_s` later, and not before the horizon
(where a job pinned to the net arrives), the kit or service is mended and both workers
restart (sync_nets at start: STOPPED). That failed start tried nothing: the net must be
started to settle its stray at once, not rest as if its SuperLink had failed to settle it
(6b4fa3b's `_settle_rest_s`); the checker's rest excuse needs a settling start since the net
left MISCONFIGURED (tests.sim.rest_window), so a rest there is `queued-while-free`
for the pinned job."""

from __future__ import annotations

from app.sim.simulation import Simulation
from app.usecases.failed_starts import SETTLE_START
from tests.sim.flower_faults import FlowerFaults


class MisfitAdversary:
    """Breaks the net's kit or service at its first settling start's scale call."""

    def __init__(self, sim: Simulation, faults: FlowerFaults) -> None:
        self.sim = sim
        self.faults = faults
        self._due = faults.misfit is not None

    def at_hook(self, point: str, net: str | None) -> None:
        """At a scale call of the net made by a settling start: break it, schedule the fix."""
        faults, sim = self.faults, self.sim
        if not self._due or point != "driver.scale" or net != faults.net:
            return
        row = sim.conn.execute("SELECT state FROM nets WHERE name = ?", (net,)).fetchone()
        last = sim.conn.execute(
            "SELECT reason FROM net_events WHERE net_name = ? ORDER BY id DESC LIMIT 1", (net,)
        ).fetchone()
        if row is None or row[0] != "STARTING" or last is None or last[0] != SETTLE_START:
            return
        self._due = False
        if faults.misfit == "kit":
            sim.cluster.servers[net].kit_broken = True
            sim.trace(f"== {net}'s admin kit broken at its settling start (CA mismatch)")
        else:
            sim.cluster.drivers[net].broken = True
            sim.trace(f"== {net}'s service missing at its settling start")
        t = sim.clock.t
        fix_at = max(t + faults.misfit_fix_s, sim.workload.horizon_s + 1.0)
        label = f"a human mends {net}'s {faults.misfit} and restarts the workers"
        sim.at(fix_at, label, self._mend)

    def _mend(self) -> None:
        sim, net = self.sim, self.faults.net
        sim.cluster.servers[net].kit_broken = False
        sim.cluster.drivers[net].broken = False
        for slot in (0, 1):
            sim.restart_worker(slot, f"a human fixed {net}'s settings")

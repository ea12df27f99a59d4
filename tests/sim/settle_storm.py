"""`settle-storm`: a scale-to-zero net holding stray runs its server never settles is started
to settle them ever less often (app.usecases.net_repairs `_start_to_settle`: once its oldest
stray is overdue the net rests at zero as long as that stray had waited, doubling, at most
SETTLE_REST_MAX_S), never every round. Seen with the sweep's faults that never end
(tests.sim.flower_faults: a SuperLink gone for good, or one refusing every stop)."""

from __future__ import annotations

import math

from app.sim.simulation import Simulation
from app.usecases.net_repairs import SETTLE_REST_MAX_S
from models import ACTIVE_JOB_STATES
from tests.sim.observer import Observer, _secs

STORM_WINDOW_S = 1800.0  # the window starts are counted in (tests.sim.flower_faults.WATCH_S)


def storm_bound(abort_timeout_s: float, window_s: float = STORM_WINDOW_S) -> int:
    """The most starts to settle one oldest stray the rule allows in `window_s`: up to 3
    while that stray is younger than ABORT_TIMEOUT_S at the net's stop (no rest; a start
    and its stop take 30 s at least, the reconcile round and the shortest idle grace), then
    rests that double from ABORT_TIMEOUT_S (at most log2(window / ABORT_TIMEOUT_S) + 1 of
    them fit), then rests of SETTLE_REST_MAX_S (window / SETTLE_REST_MAX_S + 1). For the
    sweep's 1800 s and 60 s: 9; a net started every round (its readiness deadline and a
    round or two: 60-150 s a start) makes 12 to 30."""
    doubling = math.floor(math.log2(window_s / abort_timeout_s)) + 1
    return 3 + doubling + math.floor(window_s / SETTLE_REST_MAX_S) + 1


class SettleInvariants(Observer):
    """Counts each net's job-less starts while it holds a stray, by its oldest stray."""

    def start(self, sim: Simulation) -> None:
        """Watch `sim` from now on."""
        super().start(sim)
        self._settle_starts: dict[tuple[str, str], list[float]] = {}

    def _settle_start(self, net: str, at: str) -> None:
        """The net went STARTING (event time `at`): a start to settle its strays if it
        holds one and no job or live prewarm hold wants the net."""
        if not self._has_strays:
            return
        # Simulated time, not the event's stamp: a clock stepped back (tests.sim.clock_back)
        # dates a later start before the earlier ones.
        t = self.sim.clock.t
        row = self.sim.conn.execute(
            "SELECT min(created_at) FROM stray_runs WHERE net_name = ?", (net,)
        ).fetchone()
        if row is None or row[0] is None:
            return
        if self.held(net, t) or any(
            j.net == net and j.state in ACTIVE_JOB_STATES for j in self.jobs
        ):
            return
        starts = self._settle_starts.setdefault((net, str(row[0])), [])
        starts.append(t)
        recent = [s for s in starts if s > t - STORM_WINDOW_S]
        bound = storm_bound(self.sim.settings.abort_timeout_s)
        if len(recent) > bound:
            self.report(
                "settle-storm",
                f"net {net}",
                f"started {len(recent)} times in {STORM_WINDOW_S:.0f}s to settle stray runs"
                f" (oldest since {_secs(str(row[0])) or 0.0:.0f}s; bound {bound}): at "
                + ", ".join(f"{s:.0f}" for s in recent),
            )

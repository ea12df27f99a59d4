"""The checker's rest excuse (round 13): a STOPPED Flower net holding a stray rests at zero
between its settling starts (app.usecases.net_repairs `_settle_rest_s`) only because its
server failed to settle the stray lately: a settling start within SETTLE_REST_MAX_S before
the net's stop (a start of an hour ago, for another stray, says nothing of this one; a992d97),
made since the net last left MISCONFIGURED (one that found its settings wrong tried nothing:
tests.sim.misfit), and for at most SETTLE_REST_MAX_S after that stop. Meanwhile the claim
passes the net by (not `queued-while-free`) and its stray's run waits for the next start
(not `stray-run-stopped`). Read in simulated time, as the checker's history read sees each
move (the product reads its workers' stamps, which a clock step moves: tests.sim.clock_step,
tests.sim.clock_back); SLACK_S covers the clock-step profiles' workers, up to 30 s either
way."""

from __future__ import annotations

from app.sim.simulation import Simulation
from app.sim.state import NetRow
from app.usecases.failed_starts import SETTLING_STARTS
from app.usecases.net_repairs import SETTLE_REST_MAX_S
from models import NetState

SLACK_S = 60.0


class RestWindow:
    """Each net's settling starts since it last left MISCONFIGURED, and its last stop."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._starts: dict[str, list[float]] = {}
        self._stopped: dict[str, float] = {}

    def saw(self, net: str, src: str, dst: str, reason: str, t: float) -> None:
        """A move of the net the history read found after the step that ended at `t`."""
        if src == NetState.MISCONFIGURED:
            self._starts[net] = []
        if dst == NetState.STARTING and reason in SETTLING_STARTS:
            self._starts.setdefault(net, []).append(t)
        if dst == NetState.STOPPED:
            self._stopped[net] = t

    def resting(self, net: NetRow, t: float) -> bool:
        """The net is a STOPPED Flower net holding a stray that may rest at `t`: a settling
        start within SETTLE_REST_MAX_S before its last stop, that stop less than
        SETTLE_REST_MAX_S ago."""
        if net.state != NetState.STOPPED:
            return False
        if self.sim.cluster.servers[net.name].spec.backend != "flower":
            return False
        stop = self._stopped.get(net.name)
        if stop is None or t - stop > SETTLE_REST_MAX_S + SLACK_S:
            return False
        starts = self._starts.get(net.name, ())
        if not any(stop - SETTLE_REST_MAX_S - SLACK_S <= s for s in starts):
            return False
        return self.sim.state.holds_stray(net.name)

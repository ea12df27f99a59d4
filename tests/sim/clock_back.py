"""A clock stepped back behind a stray (round 12, D1 of the break-it review of round 10): in
half the GONE worlds (tests.sim.flower_faults; stream `f"{seed}/flower-faults/clock"`, drawn
only there, so every other seed replays exactly), once the gone SuperLink's stray has been
tried by a settling start and the world is at rest but for it, both workers' clocks are stepped back
STEP_S (a VM resumed from an old snapshot, an NTP step) for the rest of the watch: every
later stop of the net is dated before the stray's recording, a wait no one can read. The
rule rests such a net the longest once a start was tried (6b4fa3b's `_settle_rest_s`); the
old rule read the negative wait as a young stray and started the net every round, which
`settle-storm` (counted in simulated time, tests.sim.settle_storm) reports."""

from __future__ import annotations

import random

from app.sim.simulation import Simulation
from app.usecases.failed_starts import ADOPTED_START, SETTLE_START

STEP_S = -3 * 3600.0  # behind every stamp the world wrote before
STEP_P = 0.5
AFTER_S = 300.0  # the earliest step after the SuperLink is gone: a few starts tried first


class ClockBack:
    """The step back of a GONE world's workers' clocks, once armed."""

    def __init__(self, sim: Simulation, net: str) -> None:
        self.sim = sim
        self.net = net
        self._at: float | None = None

    def arm(self, t: float) -> None:
        """The SuperLink is gone from `t`: draw whether (and from when) the clocks step."""
        rng = random.Random(f"{self.sim.seed}/flower-faults/clock")
        if rng.random() < STEP_P:
            self._at = t + AFTER_S + rng.uniform(0.0, 300.0)

    def after_step(self) -> None:
        """At the first step past the moment with a settling start made and no job active."""
        sim = self.sim
        if self._at is None or sim.clock.t < self._at:
            return
        tried = sim.conn.execute(
            "SELECT 1 FROM net_events WHERE net_name = ? AND reason IN (?, ?) LIMIT 1",
            (self.net, SETTLE_START, ADOPTED_START),
        ).fetchone()
        if tried is None:
            return
        # Only a world at rest but for the gone net (its stray's run, the jobs left to an
        # operator): a job or a callback on the move would be judged by stamps three hours
        # behind, which the checks and flip-api's receiver rightly refuse.
        if any("still live" not in why for why in sim.state.unsettled()):
            return
        self._at = None
        for clock in sim.process_clocks:
            clock.offset = STEP_S
        sim.trace(f"== both workers' clocks stepped {STEP_S:+.0f}s, for good")

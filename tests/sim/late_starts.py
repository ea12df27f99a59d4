"""Job-less starts asked for late, and an OUTAGE its platform denies (round 16): in bands of
the first draw of `f"{seed}/late-start"` (about 13% of its draw, none of the safeguards' and
sweep-seed tests' seeds in them, nor `left_starts`' or `platform_faults`' worlds: every
other world replays exactly), at `left_starts`' moment (a scale-to-zero ECS net STARTING at
desired 0 with no job holding it), one of (stream `f"{seed}/late-start/kind"`):

- HINT (in worlds with prewarms and PREWARM_MAX_S >= 90 s, two in three): flip-api sends a
  hint of its own (within 90 s, a net at random, at 5 s to half the horizon); at a hint's
  start (that one's or an earlier one's) with a hold live past the fault, the broker goes
  down at once (a Redis restart) for the net's ready_timeout_s and 10-60 s more, so its
  warm_up message runs only then and asks for the replica past the deadline counted from
  STARTING. `start-given-up-early` (tests.sim.start_deadlines): neither that warm-up
  (UNHEALTHY, holds failed) nor reconcile ("start abandoned") gives it up before
  ready_timeout_s after the ask (f4cc459). The net stays scale-to-zero.
- LATE (the other worlds, half): the redeploy to always-on of `left_starts`, then the same
  broker outage, so the watch asks for the replica late; the net's sites connect 35-60 s
  after its server answers, so a round sees it answer without them. `ready-once-ready`
  (tests.sim.ready_invariants) counts the deadline from the ask: READY without its sites
  only ready_timeout_s after it (86c9c12).
- DENY (the rest): the redeploy, the replica cut off past its deadline (the start goes
  OUTAGE), and from the moment its server answers again the platform denies every driver
  call as misconfigured (an IAM change propagating: `SimDriver.denying`) for 60-150 s.
  `outage-back-up` (tests.sim.always_on_starts): READY within a round, never MISCONFIGURED
  (cf265d1).

Where the redeploy makes the start always-on the net is drained 2-5 s in (32-35 s where
clocks may be stepped) until 30-90 s after the fault, so no claim takes the start."""

from __future__ import annotations

import functools
import random

from app import names
from app.sim.simulation import Simulation
from tests.sim import drains, left_starts, platform_faults
from tests.sim.left_starts import WATCH_S, LeftStart
from tests.sim.observer import _secs

# The first draw's values that give a world the fault: bands none of the named seeds' draws
# falls in (tests/unit/test_simulation_*safeguards.py, test_*_sim.py, test_sweep_seeds.py).
BANDS = (
    (0.0905, 0.1115),
    (0.1125, 0.1365),
    (0.2815, 0.3128),
    (0.3960, 0.4150),
    (0.8250, 0.8635),
)
HINT, LATE, DENY = "hint", "late", "deny"
HINT_P = 2 / 3  # of the worlds with prewarms
HELD_PAST_S = 5.0  # HINT: a hold live this long past the outage, so its warm-up asks
HOLD_S = 90.0  # HINT's own hint's within_s (ready_timeout_s, the outage's 10-60 s, and more)
LATE_P = 1 / 2  # of the others


class LateStart(LeftStart):
    """`left_starts`' moment, met by a broker outage (HINT, LATE) or a denial (DENY)."""

    STREAM = "late-start"

    def __init__(self, sim: Simulation) -> None:
        super().__init__(sim)  # its draws on this stream, as LeftStart makes them
        rng = random.Random(f"{sim.seed}/{self.STREAM}/kind")
        pick = rng.random()
        # HINT needs a hold that outlasts the outage: worlds whose PREWARM_MAX_S allows one.
        if self._hinted and sim.world.prewarm_max_s >= HOLD_S:
            self.kind = HINT if pick < HINT_P else DENY
        else:
            self.kind = LATE if pick < LATE_P else DENY
        self._late_s = rng.uniform(10.0, 60.0)  # the outage's length past ready_timeout_s
        self._sites_late_s = rng.uniform(35.0, 60.0)
        self._deny_s = rng.uniform(60.0, 150.0)
        if self.kind == DENY and self._cut_off is None:
            self._cut_off = rng.uniform(90.0, 240.0)  # (past the deadline from the ask)
        self.fired: str | None = None  # the net the fault befell (the band scripts read it)
        self._fault_end = 0.0  # when the fault is over (the undrain waits 30-90 s more)
        self._hint_sent = False  # HINT: flip-api's own hint for a net, sent once
        hint = random.Random(f"{sim.seed}/{self.STREAM}/hint")
        self._hint_at = hint.uniform(5.0, sim.workload.horizon_s / 2)
        self._hint_net = hint.choice([n.name for n in sim.world.nets])

    def _in_bands(self, first: float) -> bool:
        sim = self.sim
        left = random.Random(f"{sim.seed}/{left_starts.LeftStart.STREAM}").random()
        fault = random.Random(f"{sim.seed}/{platform_faults.PlatformFault.STREAM}").random()
        others = any(lo <= left < hi for lo, hi in left_starts.BANDS) or any(
            lo <= fault < hi for lo, hi in platform_faults.BANDS
        )
        return any(lo <= first < hi for lo, hi in BANDS) and not others

    def after_step(self) -> None:
        if self.armed and self.kind == HINT and not self._hint_sent:
            self._hint_sent = True
            # A hint of flip-api's own with a hold long enough to outlast the outage (the
            # world's hints are often shorter): the moment is its start, or an earlier one's.
            payload: dict[str, object] = {
                "caller_key": "pw-late",
                "within_s": HOLD_S,
                "required_sites": [],
                "net": self._hint_net,
            }
            send = self.sim.caller.sender(names.PREWARM, payload)
            self.sim.at(self._hint_at, f"flip-api prewarms {self._hint_net} (a late start)", send)
        super().after_step()

    def _fire(self, name: str, jobs: list[str]) -> None:
        if self.kind != HINT:
            super()._fire(name, jobs)
            return
        sim = self.sim
        timeout_s = sim.settings.net(name).ready_timeout_s
        end = sim.clock.t + timeout_s + self._late_s
        if not self._held_past(name, end + HELD_PAST_S):
            # A hold that ends before the warm-up runs releases the start: the next one.
            self.armed = True
            return
        self.fired = name
        sim.trace(f"== {name} STARTING for a hint: the broker goes down until {end:.0f}s")
        self._broker_down(end)
        sim.rest_not_before = max(sim.rest_not_before, end + timeout_s + WATCH_S)

    def _held_past(self, name: str, until: float) -> bool:
        """A live hold of the net's lasts past `until` (simulated time: the stored times'
        epoch, as tests.sim.ready_invariants reads them)."""
        max_s = self.sim.settings.prewarm_max_s
        for created, within in self.sim.conn.execute(
            "SELECT created_at, within_s FROM prewarms WHERE net_name = ? AND NOT refused"
            " AND ended_at IS NULL",
            (name,),
        ):
            created_s = _secs(created) or 0.0
            if created_s + min(float(within or 0.0), max_s) > until:
                return True
        return False

    def _broker_down(self, end: float) -> None:
        sim = self.sim
        sim.broker.outages.append((sim.clock.t, end))
        sim.trace(f"== broker down {sim.clock.t:.0f}-{end:.0f}s (a late start)")

    def _left_behind(self, name: str, jobs: list[str]) -> None:
        sim = self.sim
        t = sim.clock.t
        self.fired = name
        if self.kind == DENY:
            assert self._cut_off is not None
            sim.trace(f"   {name}'s new replica cut off for {self._cut_off:.0f}s from its ask")
            sim.cluster.servers[name].partition(t, t + self._cut_off)
            self._left = (name, t)
            end = t + self._cut_off + self._deny_s  # (at the earliest: moved at the ask)
        else:
            end = t + sim.settings.net(name).ready_timeout_s + self._late_s
            self._broker_down(end)
            sim.cluster.servers[name].sites_late_s = self._sites_late_s
            end += self._sites_late_s
        self._watch_until(end)
        sim.at(
            t + self._drain_after,
            f"operator drains {name}",
            functools.partial(drains.operator_drain, sim, (name,), False),
        )
        self._fault_end = end
        sim.at(
            end + self._undrain_after,
            f"operator undrains {name} once its fault is over",
            functools.partial(self._undrain_after_fault, name),
        )

    def _cut_off_from_ask(self) -> None:
        """As `LeftStart`'s; DENY's denial then starts as the cut-off ends (the server
        answering again), so no round sees the denial before the server answers."""
        assert self._left is not None
        name = self._left[0]
        super()._cut_off_from_ask()
        if self._left is not None:
            return  # not asked yet
        back = self.sim.cluster.servers[name].partition_until
        self.sim.cluster.drivers[name].denying = (back, back + self._deny_s)
        until = back + self._deny_s
        self.sim.trace(f"   the platform denies {name}'s driver {back:.0f}-{until:.0f}s")
        self._fault_end = back + self._deny_s
        self._watch_until(self._fault_end)

    def _undrain_after_fault(self, name: str) -> None:
        """The operator undrains 30-90 s after the fault (DENY's, once its ask is known)."""
        sim = self.sim
        at = self._fault_end + self._undrain_after
        if at > sim.clock.t:
            again = functools.partial(self._undrain_after_fault, name)
            sim.at(at, f"operator undrains {name} once its fault is over", again)
            return
        drains.operator_undrain(sim, (name,), False)

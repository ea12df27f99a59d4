"""A platform that fails a left start (round 15): in bands of the first draw of
`f"{seed}/platform-fault"` (14% of its draw: about 8% of the worlds once the clean
profile's and `left_starts`' worlds are left out; none of the safeguards' and sweep-seed
tests' seeds in them, so every other world replays exactly), the moment `left_starts` waits
for (a scale-to-zero ECS net STARTING at desired 0 made always-on by a redeploy that keeps
the count, a claim's job aborted at once) is met by the platform instead of a cut-off:

- REFUSE (two worlds in three): the platform refuses every driver call for the net (its ECS
  endpoint unreachable), or in half of them every scale call only (a throttle that never
  lets up), with a transient error, from then until well past the start's readiness
  deadline and the checker's bound (`SimDriver.refusing`). The start must page all the same:
  `start-never-outage` (tests.sim.always_on_starts) gives no slack for these refusals, only
  for the random throttle's. Round 15's D1: the watch raised before it looked at the
  deadline, and the deadline counted from the last refused ask. Once the platform answers,
  the OUTAGE at zero must get its replica (`always-on-replica`: D2 too).
- EXIT (one in three): every replica the platform starts exits at boot, reading as desired 0
  (a docker container: `SimDriver.exits_at_start`), until the start is an OUTAGE at zero
  replicas; then the cause is gone, and only the dispatcher's ask brings it back (round
  15's D2: the watch never asked for an OUTAGE's replica). `always-on-replica` counts from
  the last replica lost; `outage-back-up` wants the net READY once its server answers.

The net is drained 2-5 s after the moment (32-35 s where clocks may be stepped) until 30-90 s
after the fault, so no claim takes the start (a job's own wait_ready would page instead)."""

from __future__ import annotations

import functools
import random

from app.sim.simulation import Simulation
from tests.sim import drains, left_starts
from tests.sim.left_starts import WATCH_S, LeftStart
from tests.sim.ready_invariants import CLOCK_STEP_S

# The first draw's values that give a world the fault: bands none of the named seeds' draws
# falls in (tests/unit/test_simulation_*safeguards.py, test_always_on_start_sim.py,
# test_sweep_seeds.py, test_simulation_hang.py's 0-11).
BANDS = (
    (0.0936, 0.1263),
    (0.1271, 0.1503),
    (0.1511, 0.1723),
    (0.2242, 0.2417),
    (0.8289, 0.8560),
    (0.8809, 0.8992),
)
EXIT_P = 1 / 3
SCALE_ONLY_P = 1 / 2
CURE_CAP_S = 600.0  # a start never OUTAGE (a job took it): the replica runs again by then


class PlatformFault(LeftStart):
    """`left_starts`' moment, its start failed by the platform (REFUSE or EXIT)."""

    STREAM = "platform-fault"

    def __init__(self, sim: Simulation) -> None:
        super().__init__(sim)  # its draws on this stream, as LeftStart makes them
        rng = random.Random(f"{sim.seed}/{self.STREAM}/kind")
        self.exit = rng.random() < EXIT_P
        self.scale_only = rng.random() < SCALE_ONLY_P
        self._past_s = rng.uniform(30.0, 150.0)  # how far the refusals outlast the bound
        self._exiting: tuple[str, float] | None = None  # the net, when its replicas began to exit
        self._cured_at = 0.0  # when they stopped exiting
        self.fired: str | None = None  # the net the fault befell (the band scripts read it)

    def _in_bands(self, first: float) -> bool:
        sim = self.sim
        left = random.Random(f"{sim.seed}/{left_starts.LeftStart.STREAM}").random()
        return any(lo <= first < hi for lo, hi in BANDS) and not super()._in_bands(left)

    def after_step(self) -> None:
        if self._exiting is not None:
            self._maybe_cure()
        super().after_step()

    def _left_behind(self, name: str, jobs: list[str]) -> None:
        sim = self.sim
        t = sim.clock.t
        self.fired = name
        driver = sim.cluster.drivers[name]
        timeout_s = sim.settings.net(name).ready_timeout_s
        if self.exit:
            sim.trace(f"   {name}'s replicas exit at start (read as desired 0) until its OUTAGE")
            driver.exits_at_start = True
            self._exiting = (name, t)
            end = t + timeout_s  # at the earliest: the undrain waits for the cure (`_maybe_cure`)
        else:
            # Past the readiness deadline and the checker's bound for a job-less start, so a
            # start still STARTING then is reported while the refusals go on.
            reconcile = 2 * sim.world.housekeeping_interval_s
            slack = 2 * CLOCK_STEP_S if sim.profile.clock_step_p else 1.0
            end = t + timeout_s + reconcile + sim.bounds.unaccounted + slack + self._past_s
            what = "every scale call" if self.scale_only else "every call"
            sim.trace(f"   the platform refuses {what} for {name} until {end:.0f}s")
            driver.refusing = (t, end)
            driver.scale_only = self.scale_only
        sim.rest_not_before = max(sim.rest_not_before, end + self._undrain_after + WATCH_S)
        sim.at(
            t + self._drain_after,
            f"operator drains {name}",
            functools.partial(drains.operator_drain, sim, (name,), False),
        )
        sim.at(
            end + self._undrain_after,
            f"operator undrains {name} once its platform answers",
            functools.partial(self._undrain_after_fault, name),
        )

    def _maybe_cure(self) -> None:
        """The replicas stop exiting once the start is an OUTAGE at zero replicas (the cause
        gone: only the dispatcher's ask brings it back), at the drain or the cap at latest."""
        assert self._exiting is not None
        sim = self.sim
        name, since = self._exiting
        driver = sim.cluster.drivers[name]
        row = sim.conn.execute("SELECT state FROM nets WHERE name = ?", (name,)).fetchone()
        at_zero = driver.desired == 0 and driver.start_at is None
        outage = row is not None and row[0] == "OUTAGE" and at_zero
        # A redeploy that removed the net ends the fault too (NETS no longer names it).
        declared = sim.declared_net(name)
        timeout_s = sim.settings.net(name).ready_timeout_s if declared else 0.0
        late = sim.clock.t > since + timeout_s + CURE_CAP_S
        if declared and not (outage or sim.draining or late):
            return
        self._exiting = None
        driver.exits_at_start = False
        t = self._cured_at = sim.clock.t
        sim.trace(f"   {name}'s replicas no longer exit at start ({row[0] if row else '-'})")
        sim.rest_not_before = max(sim.rest_not_before, t + self._undrain_after + WATCH_S)

    def _undrain_after_fault(self, name: str) -> None:
        """The operator undrains once the fault is over (an exiting replica's: its cure)."""
        sim = self.sim
        at = self._cured_at + self._undrain_after
        if self._exiting is not None:  # not cured yet: looked at again in 30 s
            at = sim.clock.t + 30.0
        if at > sim.clock.t:
            again = functools.partial(self._undrain_after_fault, name)
            sim.at(at, f"operator undrains {name} once its platform answers", again)
            return
        drains.operator_undrain(sim, (name,), False)

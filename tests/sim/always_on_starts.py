"""`start-never-outage`: an always-on net STARTING with no job, past its readiness deadline
(the net's ready_timeout_s from its STARTING, or from the platform's first taking a call
for its replica since if later, app.usecases.outages) and a reconcile round, is READY (its
server answered: `net_repairs._ready_once_ready`) or OUTAGE (it did not), never STARTING
for ever: an operator pages on OUTAGE, and a server that never comes up must page.
Before the fix the always-on watch skipped STARTING, so such a net stayed STARTING until a
job was claimed onto it and that job's own readiness deadline marked it. A net holding a job
is that job's chain's (its ASSIGNED is bounded by `job-state-bounded`); the wait counts from
the latest of the net's STARTING + its deadline, its job letting go, a redeploy that made it
always-on or changed its deadline, the first call asking for its replica (whatever its
answer: round 15) + its deadline, and the last call of its driver the platform throttled at
random (the round could not act: misconfig seed 700 in tests.sim.left_starts' worlds). A
platform refusing every call for a long while (tests.sim.platform_faults) gives no such
slack: the start must page all the same (round 15's D1).

`always-on-replica` (round 14's break-it): a scalable net NETS declares always-on, with no
job and not MISCONFIGURED, is not left at a desired count of 0 for longer than a reconcile
round and the unaccounted bound (from the last driver call the platform throttled), unless
someone scaled it to 0 by hand (the adversary's drift: an OUTAGE that pages, undone by the
operator's human fix). Whatever left it there (a scale-to-zero start across a redeploy to
always-on, a claim whose job ended before its scale_up, a stop that landed after the flip),
`watch_always_on` asks for its replica: no operator does that for the dispatcher
(app.sim.operator). Before 2ea0f47 a job-less STARTING net at zero went OUTAGE past its
deadline and stayed at zero for good (tests.sim.left_starts reaches it). Not while the
platform refuses the net's calls (counted from the end of that), nor before a round after the
last replica the platform lost (an exited container reads as desired 0).

`outage-back-up` (round 15): an always-on OUTAGE with no job whose lost replica
(tests.sim.platform_faults' EXIT) runs again and answers is READY within a round and the
bound (before 6483ba4 nothing asked for that replica: `always-on-replica` finds that); round
16: so is one whose server answers while the platform denies its driver as misconfigured
(tests.sim.late_starts' DENY), and it never goes MISCONFIGURED (before cf265d1 it did)."""

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
        self._at_zero: dict[str, float] = {}  # net -> since when it is always-on at desired 0
        self._answering: dict[str, float] = {}  # net -> since when its lost replica answers
        self._was_outage: set[str] = set()  # the nets OUTAGE at the last look

    def _always_on_starts(self, t: float) -> None:
        sim = self.sim
        held = {j.net for j in self.jobs if j.state in ACTIVE_JOB_STATES}
        self._always_on_replica(t, held)
        self._outage_back_up(t, held)
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
            # A start left at zero replicas gets its deadline from the ask for its replica
            # (round 15: the round that asked was no OUTAGE, app.usecases.outages).
            due = max(due, self._asked_s(name, net.changed_s) + timeout_s)
            # A round whose driver call was throttled could not ask or look (left_starts'
            # worlds, misconfig 700): the wait counts from the last such refusal. Not a
            # platform refusing every call for good (tests.sim.platform_faults): the deadline
            # runs from the first ask all the same (round 15), so its refusals give no slack.
            due = max(due, self._last_refusal(name))
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

    def _round_bound(self) -> float:
        """Two housekeeping rounds, the unaccounted time and a start's clock slack."""
        interval_s = self.sim.world.housekeeping_interval_s
        return 2 * interval_s + self.bounds.unaccounted + self._start_slack

    def _always_on_replica(self, t: float, held: set[str | None]) -> None:
        """`always-on-replica`: no always-on net the dispatcher owns waits at 0 replicas."""
        sim = self.sim
        bound = self._round_bound()
        for net in self.nets:
            name = net.name
            driver = sim.cluster.drivers.get(name)
            if (
                driver is None
                or driver.pinned
                or driver.desired > 0
                or driver.by_hand
                or driver.broken  # (every call refused: counted from its fix)
                or driver.refuses(t)  # (its platform's outage: counted from its end)
                or net.state == NetState.MISCONFIGURED
                or name in held
                or not sim.declared_net(name)
                or sim.scales_to_zero(name)
            ):
                self._at_zero.pop(name, None)
                continue
            since = max(self._at_zero.setdefault(name, t), self._last_refusal(name))
            # A replica the platform lost (an exited container: desired 0) is asked for again
            # by the next round (tests.sim.platform_faults).
            since = max(since, driver.lost_at if driver.lost_at is not None else since)
            waited = t - self._after_broker_outages(since, t)
            if waited > bound:
                self.report(
                    "always-on-replica",
                    f"net {name}",
                    f"always-on, {net.state}, no job, desired 0 for {waited:.0f}s (bound "
                    f"{bound:.0f}s), not scaled down by hand: nothing asked for its replica",
                )

    def _outage_back_up(self, t: float, held: set[str | None]) -> None:
        """`outage-back-up`: an always-on OUTAGE whose lost replica (tests.sim.platform_faults'
        exited container) runs again and answers is READY within a round and the bound."""
        sim = self.sim
        bound = self._round_bound()
        was_outage, self._was_outage = self._was_outage, set()  # (at the last look)
        for net in self.nets:
            name = net.name
            if net.state == NetState.OUTAGE:
                self._was_outage.add(name)
            driver = sim.cluster.drivers.get(name)
            server = sim.cluster.servers.get(name)
            # An OUTAGE whose re-ask the platform denies (tests.sim.late_starts' DENY) is
            # READY as well once its server answers, never MISCONFIGURED (round 16, cf265d1).
            denied = driver is not None and driver.denying is not None
            outage = net.state == NetState.OUTAGE or (
                denied and net.state == NetState.MISCONFIGURED and name in was_outage
            )
            if (
                driver is None
                or server is None
                or (driver.lost_at is None and not denied)
                or not outage
                or not server.reachable(t)
                or name in held
                or not sim.declared_net(name)
                or sim.scales_to_zero(name)
            ):
                self._answering.pop(name, None)
                continue
            since = self._after_broker_outages(self._answering.setdefault(name, t), t)
            if net.state == NetState.MISCONFIGURED:  # (out of service until a restart)
                # Not where admin calls fail at random (chaos): a round whose server_state
                # failed saw a server away, and an OUTAGE whose server stays away is
                # MISCONFIGURED under a denial (README).
                self._answering.pop(name, None)
                if sim.profile.admin_unavailable or sim.profile.admin_unknown:
                    continue
                self.report(
                    "outage-back-up",
                    f"net {name}",
                    "always-on OUTAGE, no job, its server answering: MISCONFIGURED (its "
                    "platform denying the driver), not READY again",
                )
                continue
            if t - since > bound:
                self.report(
                    "outage-back-up",
                    f"net {name}",
                    f"always-on OUTAGE, no job, its replica answering for {t - since:.0f}s "
                    f"(bound {bound:.0f}s): not READY again",
                )

    def _asked_s(self, name: str, since: float) -> float:
        """When the dispatcher's call for a replica of the net from none first reached the
        platform, whatever its answer (the product's deadline counts from the first ask of
        any outcome, round 15), at or after `since` (within the clock-step slack; -inf: none
        since)."""
        driver = self.sim.cluster.drivers.get(name)
        asks = [] if driver is None else driver.tries
        return next((t for t in asks if t >= since - self._start_slack), float("-inf"))

    def _last_refusal(self, name: str) -> float:
        """When the platform last throttled a call of the net's driver (-inf: never)."""
        driver = self.sim.cluster.drivers.get(name)
        refused = None if driver is None else driver.refused_at
        return float("-inf") if refused is None else refused

"""`start-given-up-early` (round 16): a start is given up for its readiness deadline
(reconcile's "start abandoned": STARTING -> STOPPING; warm_up's "prewarm: not ready after":
STARTING -> UNHEALTHY, its holds failed) no sooner than the net's ready_timeout_s after the
first ask for its replica since its STARTING (a scale_up row of `scale_events`, whatever its
outcome, as `app.usecases.outages.start_age_s` counts it), or after its STARTING when none
was asked. Before f4cc459 both counted from the STARTING only: a warm-up whose message
waited past the deadline (tests.sim.late_starts' broker outage) asked for the replica and
gave up in the same call, and reconcile abandoned a boot it had just asked for. A job's
chain (wait_ready, "not ready after") counts from its claim, or from the first ask since
when its scale_up ran late: it gave the job up 0.4 s after the ask (ops 455, before
1967120), from the first ask the driver took (a refused try is retried, maybe held past the
deadline; break-it r16).

Read in the product's own stored times (the STARTING's and the give-up's stamps, the ask's),
with the clock-step slack where a worker's clock may be stepped."""

from __future__ import annotations

from app.sim.simulation import Simulation
from models import NetState
from tests.sim.observer import Observer, _secs
from tests.sim.ready_invariants import CLOCK_STEP_S, first_ask_s

# A warm-up's words (a job's chain says "not ready after" alone): a job-less start's rule.
PREWARM_GIVE_UP = "prewarm: not ready after"
# The reasons of a give-up for the deadline (not a failed driver, a drain, a hold's end).
GIVE_UPS = {
    NetState.STOPPING: ("start abandoned",),
    NetState.UNHEALTHY: ("not ready after", PREWARM_GIVE_UP),
}


class StartDeadlines(Observer):
    """`start-given-up-early`, from the net history rows as `Checker._history` reads them."""

    # ReadyInvariants' (the Checker's other base): when each net last moved to STARTING and
    # had a job claimed onto it, in simulated time, and its last READY's reason (kept here).
    _starting_at: dict[str, float]
    _claimed_at: dict[str, float]
    _ready_reason: dict[str, str]

    def start(self, sim: Simulation) -> None:
        super().start(sim)
        self._started_stamp: dict[str, float] = {}  # net -> its last STARTING's stored time
        self._deadline_slack = CLOCK_STEP_S if sim.profile.clock_step_p else 1.0

    def _net_moved(self, net: str, src: str, dst: str, at: str, reason: str) -> None:
        """One net history row: a STARTING's stamp kept, a give-up for the deadline checked."""
        at_s = _secs(at)
        if src == NetState.STARTING and dst == NetState.READY:
            self._ready_reason[net] = reason
        if dst == NetState.STARTING and at_s is not None:
            self._started_stamp[net] = at_s
            return
        words = GIVE_UPS.get(NetState(dst))
        started = self._started_stamp.get(net)
        if (
            src != NetState.STARTING
            or words is None
            or not reason.startswith(words)
            or started is None
            or at_s is None
            or not self.sim.declared_net(net)
        ):
            return
        slack = self._deadline_slack
        claimed = self._claimed_at.get(net, float("-inf"))
        chain = (
            dst == NetState.UNHEALTHY
            and not reason.startswith(PREWARM_GIVE_UP)
            and claimed >= self._starting_at.get(net, float("inf")) - slack
        )
        if chain:
            # A job's wait_ready (a warm-up names itself, chaos 7361: a job claimed onto the
            # prewarm's start and aborted before the warm-up gave it up): its chain's deadline
            # counts from its claim, or from the first ask since when its scale_up ran late
            # (round 16: dispatch gave the job up at its ask, ops 455). Reconcile abandons
            # only a job-less start.
            started = max(started, claimed)
        # A chain counts only an ask the driver took (its scale_up retries a refused one,
        # maybe late: break-it r16); a job-less start any ask, refused ones too.
        asked = first_ask_s(self.sim, net, started, slack, taken=chain)
        if asked is None or asked > at_s + slack:
            # Nothing asked for: its deadline counts from the STARTING. (An ask stamped after
            # the give-up: the workers' clocks stepped back between them, tests.sim.clock_back's
            # three hours, so the stamps' order says nothing; seed 241.)
            return
        timeout_s = self.sim.settings.net(net).ready_timeout_s
        if at_s - asked < timeout_s - slack:
            self.report(
                "start-given-up-early",
                f"net {net} at {at_s:.1f}",
                f"{src} -> {dst} ({reason[:120]}) {at_s - asked:.1f}s after its replica was "
                f"asked for ({at_s - started:.1f}s after STARTING): ready_timeout_s is "
                f"{timeout_s:.0f}s from the ask",
            )

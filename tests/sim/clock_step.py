"""STEP (round 13): a clock stepped back a few seconds at a Flower net's take-down, an hour
after its last settling start (row 7 of round 12's second break-it, FINDINGS.md). Drawn in
bands of `tests.sim.flower_faults`' first draw (`STEP_BANDS`: no named seed falls in them,
so every other seed replays exactly), on a scale-to-zero net with a state database, its own
draws on the stream `f"{seed}/flower-faults/step"`:

- early: a job pinned to the net (`EARLY_KEY`); the net's first start-run whose run is
  still pending (its SuperExec's poll for it `CLAIM_LATE_S` late) is followed by the
  SuperLink's death once the dispatch reads the start time (as `flower_faults`' crash): the
  job is lost past the grace, its run a stray the state database keeps, and the net is
  started to settle it (a SETTLE_START), which it does once the SuperLink is back;
- the world drains and rests; the hour (SETTLE_REST_MAX_S) and more passes, fast-forwarded
  (`app.sim.fast_forward`: nothing is due, no fault is left);
- late: a job pinned to the net (`LATE_KEY`), its start-run followed by the crash again, so
  its run is a new stray; at the take-down (the scale call of the net STOPPING with that
  stray) both workers' clocks step back `step_s` (an NTP step) for good: the stop is dated
  before the stray's recording, a wait no one can read; then another job pinned to the net
  (`BEHIND_KEY`) waits for it.

The rule (a992d97's `_settle_rest_s`) counts only settling starts within SETTLE_REST_MAX_S
before such a stop: none, so the net is started at once, settles the stray and takes the
jobs. The rule before it counted the start of an hour ago and rested the net an hour, the
job behind it waiting: `queued-while-free`, since the checker excuses a rest only with a
settling start within SETTLE_REST_MAX_S before the stop (tests.sim.rest_window); the
stray's run, living on through that rest, is `stray-run-stopped`."""

from __future__ import annotations

import random
from dataclasses import dataclass

from app.schemas import job_id_for
from app.sim import superlink
from app.sim.faults import FaultProfile
from app.sim.simulation import Simulation
from app.sim.workload import JobSpec, NetSpec, Workload
from app.usecases.net_repairs import SETTLE_REST_MAX_S

# The first draw's values (of `f"{seed}/flower-faults"`) that give a world STEP: about 4% of
# the Flower worlds, with a scale-to-zero net keeping its runs in a database a third of them.
STEP_BANDS = ((0.0020, 0.0360), (0.5860, 0.6165), (0.8980, 0.9280))
EARLY_KEY = "settled-an-hour-before"
LATE_KEY = "stray-after-the-hour"
BEHIND_KEY = "behind-the-late-stray"
LATE_AFTER_S = SETTLE_REST_MAX_S + 900.0  # past the horizon: the early settling long over
WATCH_S = 600.0  # the late stage's watch: the stray settled, both jobs run
WAKE_S = 5.0  # the fast clock stops this long before the late job arrives
CLAIM_LATE_S = 5.0  # the SuperExec's poll of the run to crash with, later than its usual 2 s
POINTS = ("admin.submit.after", "admin.server_start_time", "driver.scale")


def in_bands(first: float) -> bool:
    """Whether the Flower faults' first draw gives the world STEP."""
    return any(lo <= first < hi for lo, hi in STEP_BANDS)


def step_s(seed: int, net: NetSpec, profile: FaultProfile) -> float:
    """How far the clocks step back (0: no STEP world: a clean one, an always-on net, or
    one whose SuperLink keeps its runs in memory, where a crash leaves no stray to settle)."""
    rng = random.Random(f"{seed}/flower-faults/step")
    step = round(rng.uniform(1.0, 8.0), 1)
    if profile.clean or net.kind == "static" or not net.keeps_jobs:
        return 0.0
    return step


def jobs(seed: int, net: str, workload: Workload) -> tuple[JobSpec, ...]:
    """The three jobs pinned to the net: early (its crash leaves the first stray), late
    (past the horizon and the hour: the second), and the one behind the late stray."""
    rng = random.Random(f"{seed}/flower-faults/step")
    rng.random()  # step_s's draw
    horizon = workload.horizon_s
    early = round(rng.uniform(5.0, max(6.0, horizon / 2)), 1)
    late = round(horizon + LATE_AFTER_S + rng.uniform(0.0, 300.0), 1)
    behind = round(late + rng.uniform(10.0, 40.0), 1)
    return (
        JobSpec(key=EARLY_KEY, arrive_s=early, duration_s=30.0, net=net),
        JobSpec(key=LATE_KEY, arrive_s=late, duration_s=30.0, net=net),
        JobSpec(key=BEHIND_KEY, arrive_s=behind, duration_s=30.0, net=net),
    )


@dataclass
class _Crash:
    """A crash owed to a start-run: the message whose submit returned with a run pending."""

    message: int


class ClockStep:
    """STEP's moves: the two crashes, the fast-forwarded hour, the clocks' step."""

    def __init__(self, sim: Simulation, net: str, step: float) -> None:
        self.sim = sim
        self.net = net
        self.step = step
        self.rng = random.Random(f"{sim.seed}/flower-faults/step/moments")
        self._late_job = str(job_id_for(LATE_KEY))
        late = sim.job_spec(self._late_job)
        self._late_at = late.arrive_s if late is not None else None
        self._early_done = False
        self._late_done = False
        self._due: _Crash | None = None
        self._stepped = False
        self._forwarding = False
        if self._late_at is not None:
            sim.rest_not_before = max(sim.rest_not_before, self._late_at + WATCH_S)
            sim.at(self._late_at - WAKE_S, "the fast clock stops: the late job comes", self._wake)

    def at_hook(self, point: str, net: str | None) -> None:
        """After a start-run of the net: the crash owed; at its take-down's scale call with
        the late stray recorded: the step."""
        sim = self.sim
        if net != self.net or point not in POINTS:
            return
        if point == "driver.scale":
            self._maybe_step()
            return
        if len(sim.running) != 1 or sim.stalled is not None or sim.conn.in_transaction:
            return
        message = sim.current[-1]
        if not {"job_id", "net_name", "attempt"} <= message.kwargs.keys():
            return  # not a chain's step
        if point == "admin.submit.after" and self._owes_crash(str(message.kwargs["job_id"])):
            if self._pending_run():
                self._due = _Crash(message.id)
                self._claim_later()
        elif point == "admin.server_start_time" and self._due is not None:
            due, self._due = self._due, None
            if due.message == message.id and self._pending_run():
                self._crash()

    def _owes_crash(self, job_id: str) -> bool:
        """The net's first start-run with a run pending before the late job comes, and
        then the late job's first."""
        if not self._early_done:
            return self._late_at is not None and self.sim.clock.t < self._late_at
        return not self._late_done and job_id == self._late_job

    def _crash(self) -> None:
        """The SuperLink dies with the run pending, down past the server-lost grace."""
        sim = self.sim
        if not self._early_done:
            self._early_done = True
        else:
            self._late_done = True
        down = sim.settings.server_lost_grace_s + self.rng.uniform(30.0, 150.0)
        sim.trace(f"== {self.net}'s SuperLink dies with a run pending ({down:.0f}s; STEP)")
        sim.cluster.crash(self.net, sim.clock.t, down)

    def _claim_later(self) -> None:
        """The SuperExec's poll comes CLAIM_LATE_S later for this run (it may come any time):
        the run is still pending when the dispatch reads the start time, where it dies."""
        server = self.sim.cluster.servers[self.net]
        run = next(reversed(server.store.values()))
        assert run.claimed_at is not None and run.starts_at is not None
        run.claimed_at += CLAIM_LATE_S
        run.starts_at += CLAIM_LATE_S
        if run.end_at is not None:
            run.end_at += CLAIM_LATE_S

    def _pending_run(self) -> bool:
        server = self.sim.cluster.servers[self.net]
        if not isinstance(server, superlink.SuperLink) or not server.store:
            return False
        run = next(reversed(server.store.values()))
        return superlink.record(run, self.sim.clock.t)[0] == "pending"

    def _maybe_step(self) -> None:
        """The take-down of the net after the late crash: its run kept as a stray, the net
        STOPPING, the scale call under way: both clocks step back, so the STOPPED the
        call's confirmation writes is dated before the stray."""
        sim = self.sim
        if self._stepped or not self._late_done:
            return
        row = sim.conn.execute("SELECT state FROM nets WHERE name = ?", (self.net,)).fetchone()
        if row is None or row[0] != "STOPPING":
            return
        stray = sim.conn.execute(
            "SELECT 1 FROM stray_runs WHERE net_name = ? AND replace(job_id, '-', '') = ?",
            (self.net, self._late_job.replace("-", "")),
        ).fetchone()
        if stray is None:
            return
        self._stepped = True
        for clock in sim.process_clocks:
            clock.offset -= self.step
        sim.trace(f"== both workers' clocks stepped -{self.step:.1f}s at {self.net}'s take-down")

    def after_step(self) -> None:
        """Once the world has drained and rests, the hour before the late job passes on the
        fast clock (nothing is due and no fault is left: no tick it skips would act)."""
        sim = self.sim
        if self._forwarding or self._late_at is None or not sim.draining:
            return
        if sim.clock.t > self._late_at - WAKE_S - 60.0:
            return
        if sim.state.holds_stray(self.net) or sim.state.unsettled():
            return
        self._forwarding = True
        sim.fast_forward = True
        sim.trace("== at rest: the fast clock runs to the late job")

    def _wake(self) -> None:
        self.sim.fast_forward = False

"""A check stalled across a whole cycle of its net (round 19: the sweep's reach of round 18's
58e42bb and 24d15ca): in bands of the first draw of `f"{seed}/stale-start"` (about 7% of the
draw, none of the safeguards' and sweep-seed tests' seeds in them, so every other world
replays exactly; the clean profile's worlds left out), a world always has prewarms
(tests.sim.seeds) and flip-api sends a hint of its own (`KEY`, within 120 s), armed from a
moment in the workload's first third, the moment a net that scales to zero is STOPPED with
no stray run (one no queued job could be claimed onto, if any). A check of that net's
job-less start then stalls (`Simulation.pause`, tests.sim.races' stall, told when to end:
`done`) while flip-api cancels the net's holds, the start ends (READY, idle, stopped; or
abandoned at its deadline) and flip-api hints again once the net is STOPPED with its server
gone (a new key each time, up to `AGAIN` hints 30 s apart, should a job's claim take the new
start first); the check resumes the moment the new start is as the kind (stream
`f"{seed}/stale-start/kind"`) wants, and acts with what it read of the old start:

- GIVE_UP (a quarter): prewarm's `warm_up` polling a start whose replica was asked for
  stalls in its driver call (58e42bb's seed 5853); the new hint comes once the old ask is
  ready_timeout_s old, and it resumes once the new start's replica is asked for: counted
  from the old ask, the new start is past its deadline (`start-given-up-early`).
- ABANDON (15%): the same stall in a reconcile round that read the net STARTING: "start
  abandoned" (`start-given-up-early`; acd7a59, found by this band: crashy 1028).
- MARK_READY (a quarter): a `warm_up` or reconcile whose readiness check found the old
  server ready (every site connected) stalls before acting on it (a reply slow to come
  back); it resumes the moment the new start is written, no replica asked for yet: READY
  with no server behind it (`ready-once-ready`; 24d15ca's `mark_ready`).
- RELEASE_START (15%), RELEASE_HOLD (20%): flip-api cancels the holds the moment a hint
  starts the net (through the API, at once, before its warm-up runs), so the warm-up reads
  no live hold, its driver desiring no replica, and stalls before its release; meanwhile
  reconcile abandons the start at its deadline and flip-api hints again (START: it resumes
  the moment the new start is written), or flip-api hints again at once, the start still the
  one read (HOLD: it resumes once the hold is stored). The release would stop a start a live
  hold wants (`released-while-held`, tests.sim.prewarm_invariants; 24d15ca's `_release`).

A stall ends short of its task's soft time limit (which would end it in a worker) if the
world never gets there; the world then runs on until the last hint's hold could have ended.
Flip-api's sends here are never dropped or duplicated by the broker."""

from __future__ import annotations

import dataclasses
import functools
import json
import random

from sqlalchemy.exc import SQLAlchemyError

from app import names
from app.celery_app import HOUSEKEEPING_SOFT_LIMIT_S, PIPELINE_SOFT_LIMIT_S
from app.sim.simulation import Simulation
from app.usecases import prewarm
from tests.sim.left_starts import WATCH_S
from tests.sim.observer import _secs
from tests.sim.ready_invariants import CLOCK_STEP_S, first_ask_s

# Gaps between the named seeds' draws of this stream (tests/unit/test_sweep_seeds.py,
# test_simulation*.py, test_*safeguards.py, test_*_sim.py: every seed they run, every
# integer listed in them, and 0-199; a margin of 0.0005 each side).
BANDS = (
    (0.0718, 0.0763),
    (0.0778, 0.0820),
    (0.2059, 0.2105),
    (0.2606, 0.2660),
    (0.3492, 0.3534),
    (0.4267, 0.4313),
    (0.4337, 0.4387),
    (0.4961, 0.5005),
    (0.5233, 0.5331),
    (0.7378, 0.7434),
    (0.7666, 0.7721),
    (0.8775, 0.8817),
    (0.9511, 0.9567),
    (0.9848, 0.9909),
)
STREAM = "stale-start"
GIVE_UP, ABANDON, MARK_READY = "give-up", "abandon", "mark-ready"
RELEASE_START, RELEASE_HOLD = "release", "hold"
KINDS = (
    (GIVE_UP, 0.25),
    (ABANDON, 0.15),
    (MARK_READY, 0.25),
    (RELEASE_START, 0.15),
    (RELEASE_HOLD, 0.2),
)
KEY = "stale-start-0"  # the first hint's; the later ones `stale-start-1` and on
AGAIN = 4  # at most this many hints again (a job's claim may take a new start first)
AGAIN_AFTER_S = 30.0  # a hint again comes this long after the last (refused: a drain)
HOLD_S = 120.0  # its hints' within_s
# A stall ends by then (a cycle the world never completes): short of the task's soft time
# limit, which would end it in a worker (its run so far counted), and this margin more.
LIMIT_MARGIN_S = 10.0
ANSWERED = ("driver.observe", "admin.is_ready")  # the answers a stale action follows
STOPPED = "STOPPED"  # the first hint's trigger state (app.sim.caller)


def in_bands(seed: int) -> bool:
    """Whether the seed's first draw of the stream falls in a band."""
    first = random.Random(f"{seed}/{STREAM}").random()
    return any(lo <= first < hi for lo, hi in BANDS)


def armed_for(sim: Simulation) -> bool:
    """Whether `sim`'s world is a band world (one with prewarms: tests.sim.seeds)."""
    return not sim.profile.clean and in_bands(sim.seed) and bool(sim.workload.prewarms)


class StaleStart:
    """flip-api's hints and cancels, and the stall, of a band world."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.armed = armed_for(sim)
        rng = random.Random(f"{sim.seed}/{STREAM}/kind")
        pick, self.kind = rng.random(), RELEASE_HOLD
        for kind, share in KINDS:
            if pick < share:
                self.kind = kind
                break
            pick -= share
        self._hint_at = rng.uniform(5.0, sim.workload.horizon_s / 3)
        self._pick = rng.random()  # which net (of those that scale to zero at the schedule)
        self.net: str | None = None
        self._answer: tuple[int, float, str] | None = None  # (message, began, call) answered
        self._started: str | None = None  # the start read: the net's STARTING stamp
        self._cancelled = False  # RELEASE_*: the holds cancelled at the start
        self._stalled = False  # the stall happened (once per world)
        self._stalling = False  # the stall is on
        self._asked_s = 0.0  # the old start's first ask (its stored time, in seconds)
        self._hinted_at: float | None = None  # when flip-api last hinted again
        self._again = 0  # the hints again so far
        self.stalls = 0  # the stalls made (the band's safeguard reads them)

    def schedule(self) -> None:
        """The first hint, from a moment in the first third of the workload on: sent the
        moment a net that scales to zero is STOPPED with no stray run (`_candidates`)."""
        sim = self.sim
        if not self.armed:
            return
        label = "flip-api prewarms a stopped net (a stale start)"
        arm = functools.partial(sim.caller.arm, self._free_net, STOPPED, label, self._first_hint)
        sim.at(self._hint_at, f"{label}, armed", arm)

    def _candidates(self) -> list[str]:
        """The STOPPED nets that scale to zero and hold no stray run; those no queued job
        could be claimed onto (none names them, none names no net) if any."""
        sim = self.sim
        rows = sim.conn.execute(
            "SELECT n.name, EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'QUEUED'"
            " AND (j.requested_net IS NULL OR j.requested_net = n.name)) FROM nets n"
            " WHERE n.state = 'STOPPED'"
            " AND NOT EXISTS (SELECT 1 FROM stray_runs s WHERE s.net_name = n.name)"
            " ORDER BY n.name"
        ).fetchall()
        nets = [(wanted, name) for name, wanted in rows if sim.scales_to_zero(name)]
        free = [name for wanted, name in nets if not wanted]
        return free or [name for _, name in nets]

    def _free_net(self) -> str:
        """The trigger's state (app.sim.caller): STOPPED while a candidate net is."""
        return STOPPED if self._candidates() else ""

    def _first_hint(self) -> None:
        nets = self._candidates()
        if not nets:
            return
        self.net = nets[int(self._pick * len(nets))]
        self._hint(KEY)

    def _hint(self, key: str) -> None:
        """flip-api's hint for the net (never dropped nor duplicated by the broker)."""
        payload = {"caller_key": key, "within_s": HOLD_S, "required_sites": [], "net": self.net}
        self._send(names.PREWARM, payload)

    def _send(self, task: str, payload: dict[str, object]) -> None:
        sent = json.loads(json.dumps(payload))
        self.sim.broker.push(task, {"payload": sent}, origin="flip-api", faulty=False)

    # --- the moment ---------------------------------------------------------------------

    def after_step(self) -> None:
        """RELEASE_*: the holds cancelled the moment a hint starts the net; during a stall,
        flip-api's new hint once the world is ready for it."""
        if not self.armed or self.net is None:
            return
        if self._stalling:
            self._maybe_hint_again()
        elif self.kind in (RELEASE_START, RELEASE_HOLD) and not self._cancelled:
            self._cancel_at_start()

    def _net_row(self) -> tuple[str, str] | None:
        row = self.sim.conn.execute(
            "SELECT state, state_changed_at FROM nets WHERE name = ?", (self.net,)
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def _open_keys(self) -> list[str]:
        return [
            str(key)
            for (key,) in self.sim.conn.execute(
                "SELECT caller_key FROM prewarms WHERE net_name = ? AND outcome IS NULL"
                " AND NOT refused",
                (self.net,),
            )
        ]

    def _cancel_at_start(self) -> None:
        """A hint's start of the net, before its warm-up runs: flip-api cancels the holds
        (through the API: the use case at once, outside any worker)."""
        sim = self.sim
        if sim.running or sim.draining:
            return
        row = self._net_row()
        driver = sim.cluster.drivers.get(self.net or "")
        if row is None or row[0] != "STARTING" or driver is None or driver.desired:
            return
        reason = sim.conn.execute(
            "SELECT reason FROM net_events WHERE net_name = ? ORDER BY id DESC LIMIT 1",
            (self.net,),
        ).fetchone()
        if reason is None or not str(reason[0]).startswith("prewarm "):
            return
        self._cancelled = True
        sim.trace(f"== {self.net} STARTING for a hint: flip-api cancels its holds at once")
        self._cancel_holds(direct=True)

    def _cancel_holds(self, *, direct: bool) -> None:
        sim = self.sim
        rt = dataclasses.replace(sim.workers[0], sessions=sim.sessions, clock=sim.clock)
        for key in self._open_keys():
            if direct:
                try:
                    prewarm.cancel_prewarm(rt, key)
                    continue
                except SQLAlchemyError:  # a simulated database fault: sent as a message
                    pass
            self._send(names.CANCEL_PREWARM, {"caller_key": key})

    def at_hook(self, point: str, net: str | None) -> None:
        """GIVE_UP, ABANDON: the stall at the check's driver call (its answer is read after
        it); the others: at the check's next hook after the answer it acts on."""
        if not self.armed or self._stalled or self.net is None:
            return
        sim = self.sim
        if len(sim.running) != 1 or sim.stalled is not None or sim.conn.in_transaction:
            return
        message = sim.current[-1]
        warm = message.task == names.WARM_UP and message.kwargs.get("net_name") == self.net
        check = message.task == names.RECONCILE
        if self.kind in (GIVE_UP, ABANDON):
            stalls = warm if self.kind == GIVE_UP else check
            if stalls and point == "driver.observe" and net == self.net and self._booting():
                self._stall(point)
            return
        if not (warm or (check and self.kind == MARK_READY)):
            return
        began = sim.delivery.began.get(message.id, -1.0)
        if point in ANSWERED and net == self.net:
            self._answer = (message.id, began, point)
            return
        answer, self._answer = self._answer, None
        if point != "db.session" or answer is None or answer[:2] != (message.id, began):
            return
        if self._stale_decision(answer[2]):
            self._stall(point)

    def _job_less_start(self) -> str | None:
        """The net's STARTING stamp, if it is STARTING with no active job."""
        row = self._net_row()
        if row is None or row[0] != "STARTING":
            return None
        held = self.sim.conn.execute(
            "SELECT 1 FROM jobs WHERE net_name = ? AND state IN ('ASSIGNED', 'DISPATCHING',"
            " 'RUNNING', 'FINISHING', 'ABORTING') LIMIT 1",
            (self.net,),
        ).fetchone()
        return None if held else row[1]

    def _booting(self) -> bool:
        """A job-less start whose replica the driver was asked for."""
        assert self.net is not None
        self._started = self._job_less_start()
        return self._started is not None and bool(self.sim.cluster.drivers[self.net].desired)

    def _stale_decision(self, call: str) -> bool:
        """The answer just given is one the kind's stale action follows (next: `_release`
        for a driver desiring none with no live hold; `mark_ready` for a server that
        answers with every site of the net connected)."""
        sim = self.sim
        assert self.net is not None
        self._started = self._job_less_start()
        if self._started is None:
            return False
        if self.kind in (RELEASE_START, RELEASE_HOLD):
            desired = sim.cluster.drivers[self.net].desired
            return (
                self._cancelled
                and call == "driver.observe"
                and not desired
                and not self._open_keys()
            )
        server = sim.cluster.servers[self.net]
        t = sim.clock.t
        spec = next((n for n in sim.world.nets if n.name == self.net), None)
        sites = set(spec.sites) if spec is not None else set()
        return call == "admin.is_ready" and server.answering(t) and sites <= set(server.sites(t))

    def _stall(self, point: str) -> None:
        sim = self.sim
        assert self.net is not None and self._started is not None
        self._stalled = True
        self.stalls += 1
        slot = sim.running[-1]
        message = sim.current[-1]
        task = message.task.removeprefix(names.PREFIX)
        sim.trace(f"== {task} of {self.net}'s start stalls at {point} ({self.kind})")
        warm = message.task == names.WARM_UP
        limit = PIPELINE_SOFT_LIMIT_S if warm else HOUSEKEEPING_SOFT_LIMIT_S
        ran = sim.clock.t - sim.delivery.began.get(message.id, sim.clock.t)
        cap = limit - ran - LIMIT_MARGIN_S
        if self.kind in (GIVE_UP, ABANDON, MARK_READY):
            started_s = _secs(self._started) or sim.clock.t
            slack = CLOCK_STEP_S if sim.profile.clock_step_p else 1.0
            self._asked_s = first_ask_s(sim, self.net, started_s, slack) or sim.clock.t
            self._cancel_holds(direct=False)
        elif self.kind == RELEASE_HOLD:
            self._hint_again()
        self._stalling = True
        try:
            sim.pause(slot, point, cap, self._done)
        finally:
            self._stalling = False
            self.armed = False
            # The world's liveness counts from the resume (a stall past its horizon), and it
            # runs on until its last hint's hold could have ended.
            hold_end = sim.clock.t if self._hinted_at is None else self._hinted_at + HOLD_S
            sim.rest_not_before = max(sim.rest_not_before, sim.clock.t, hold_end + WATCH_S)

    def _maybe_hint_again(self) -> None:
        """During the stall: flip-api hints again once the start read has ended (STOPPED,
        its server gone) and, for GIVE_UP and ABANDON, its first ask is past the deadline;
        again if a job's claim took the new start before the hint (STOPPED once more)."""
        sim = self.sim
        if self._again >= AGAIN:
            return  # (hinted also past the horizon: the stall began before it)
        assert self.net is not None
        row = self._net_row()
        if row is None or row[0] != "STOPPED":
            return
        if self._hinted_at is not None and (
            sim.clock.t < self._hinted_at + AGAIN_AFTER_S or not self._ended(self._key())
        ):
            return  # its hint is still on its way, or holds the net
        if self.kind in (GIVE_UP, ABANDON, MARK_READY):
            if sim.cluster.servers[self.net].answering(sim.clock.t):
                return
            slack = CLOCK_STEP_S if sim.profile.clock_step_p else 1.0
            due = self._asked_s + sim.settings.net(self.net).ready_timeout_s + slack + 1.0
            if self.kind != MARK_READY and sim.clock.t < due:
                return
        sim.trace(f"== {self.net} stopped: flip-api prewarms it again")
        self._hint_again()

    def _key(self) -> str:
        return f"stale-start-{self._again}"

    def _hint_again(self) -> None:
        self._again += 1
        self._hinted_at = self.sim.clock.t
        self._hint(self._key())

    def _ended(self, key: str) -> bool:
        """The hint was handled and its hold is over (used by a job, or ended)."""
        row = self.sim.conn.execute(
            "SELECT outcome FROM prewarms WHERE caller_key = ?", (key,)
        ).fetchone()
        return row is not None and row[0] is not None

    def _done(self) -> bool:
        """The world is as the kind waits for: the stalled check resumes (a new start of
        the hint's, no job on it; for GIVE_UP and ABANDON once its replica is asked for)."""
        if self._hinted_at is None:
            return False
        if self.kind == RELEASE_HOLD:
            return self._key() in self._open_keys()
        started = self._job_less_start()
        if started is None or started == self._started:
            return False
        if self.kind not in (GIVE_UP, ABANDON):
            return True
        assert self.net is not None
        return any(t >= self._hinted_at for t in self.sim.cluster.drivers[self.net].asks)

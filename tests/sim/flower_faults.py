"""The Flower faults a break-it review found the sweep blind to (tests/sim/FINDINGS.md, "Three
Flower defects"), drawn in the worlds with a Flower net on a stream of their own
(`f"{seed}/flower-faults"`, drawn only there and at the Flower net's own start-runs, so every
other seed replays as before):

- `race`: at a Flower start-run (the hook between the submit's token lookup and its
  start-run), another chain's dispatch of the same attempt gets in and the job adopts its
  run; then this start-run starts a second run and its reply is lost (cf206eb, 849753f).
- `crash`: a SuperLink with a state database dies right after a submit returned (the job
  adopts the run), the run still pending, and stays down past the server-lost grace; the
  run waits in the database and the next SuperLink's SuperExec starts it (098c1cf).
- `bad_app`: a job pinned to the Flower net whose definition is a malformed Flower App (a
  bundle the adversary writes before the job arrives, app.sim.bundles); `BadAppWatch`
  checks that it fails at once as `definition_invalid` (b97bb2e).

And, in a band of the first draw of its own (the worlds above replay exactly), a fault that
never ends, where round 9's break-it of the strays' settling found two defects no ending
fault shows (FINDINGS.md, "Round 9: breaking the Flower strays' settling"; c454e0c), on a
scale-to-zero net, with a job pinned to it sent just before the horizon:

- `GONE`: from the first moment after `forever_at` a job runs there, the SuperLink never
  answers again, across restarts (its replica runs; app.sim.superlink `gone_from`). The job
  is lost, its run a stray no one can settle; the run goes on WATCH_S (30 min) past the
  fault before it may end at rest, so `settle-storm` (tests.sim.settle_storm) can count the
  net's starts to settle it. At rest the stray's job and the pinned one wait for an
  operator (app.sim.state `_left_to_operator`), and the net rests at zero.
- `DEAF`: a state database only. At the first start-run after `forever_at` whose run is
  still pending, the SuperLink dies (as `crash`) and comes back refusing every StopRun for
  good (`refuses_stops_from`); the run hangs once revived. It revives with every SuperLink
  until a stop lands, so the net started to settle it is READY with its stray; the pinned
  job must not keep that server up (`idle-net-at-zero`; the stray's run lives on with it:
  `stray-run-stopped`). Taken down while running, the run expires and is settled.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from app import names
from app.schemas import job_id_for
from app.sim import superlink
from app.sim.bundles import MALFORMED_FLOWER_APPS, write_malformed_flower_app
from app.sim.faults import FaultProfile
from app.sim.messages import Message
from app.sim.simulation import Simulation
from app.sim.workload import JobSpec, NetSpec, Workload, WorldSpec
from tests.sim import clock_step
from tests.sim.clock_back import ClockBack
from tests.sim.observer import Observer

BAD_APP_KEY = "bad-flower-app"
BAD_APP_DEFINITION = "flower-app-malformed"
INVARIANT = "malformed-app-refused"
BAND = (0.37, 0.49)  # the first draw's values that give a world Flower faults
# ... and those that give it a fault that never ends instead (none of the named seeds).
FOREVER_BAND = (0.185, 0.28)
# ... and those that give it the crash and a settling start that finds the net's settings
# wrong (MISFIT; round 12, none of the named seeds either).
MISFIT_BAND = (0.112, 0.168)
# ... and those that give it IDLE: the Flower net always-on, the race at its every start-run,
# and the list of runs refused from the lost start-run through the round that ends the job
# (round 12, none of the named seeds either). The later run outlives the job.
IDLE_BAND = (0.284, 0.314)
LATER_RUN_EXTRA_S = 240.0  # the later run trains once the first one is over
# Where the actions happen: before a start-run, right after it, and at the start-time read
# a dispatch makes once its submit returned (app.usecases.dispatch).
POINTS = ("admin.submit", "admin.submit.after", "admin.server_start_time")
OUTAGE_P = 0.5  # a race's lost start-run is followed by an outage of the SuperLink
OUTAGE_MIN_S = 60.0  # mostly past the failing step's retries (full jitter: 61 s on average)


# The faults that never end, and how long the world is watched at rest after one began.
GONE = "gone"  # the SuperLink never answers again (its replica runs)
DEAF = "deaf"  # the SuperLink answers, and refuses every StopRun
FOREVER = (GONE, DEAF)
WATCH_S = 1800.0
BEHIND_STRAY_KEY = "behind-stray"  # the job pinned to the Flower net of such a world


@dataclass(frozen=True)
class FlowerFaults:
    """What a world with a Flower net draws: the chance of the race at each of the net's
    start-runs, of a crash right after one (a state database only), the malformed app, and
    a fault that never ends from the first moment after `forever_at` a job runs there."""

    net: str
    race_p: float = 0.0
    crash_p: float = 0.0
    bad_app: str | None = None  # a key of MALFORMED_FLOWER_APPS
    bad_app_at: float = 0.0
    forever: str | None = None  # GONE, DEAF, or None
    forever_at: float = 0.0
    misfit: str | None = None  # "kit" or "service": broken at the first settling start
    misfit_fix_s: float = 0.0  # how long until a human fixes it and restarts the workers
    idle_blip: bool = False  # IDLE: the lists of runs refused until the raced job ends
    clock_step_s: float = 0.0  # STEP: the clocks' step back at the late take-down (clock_step)


def plan(seed: int, world: WorldSpec, profile: FaultProfile) -> FlowerFaults | None:
    """The seed's Flower faults (None: no Flower net, or none drawn)."""
    flower = [n for n in world.nets if n.backend == "flower"]
    if not flower:
        return None
    net = flower[0]
    rng = random.Random(f"{seed}/flower-faults")
    # A band of the first draw where none of the seeds the safeguards and the sweep-seed
    # tests name falls (tests/unit/test_simulation_*safeguards.py, test_sweep_seeds.py): their
    # worlds replay as before. About one Flower world in eight; another band, as free of
    # them when it was chosen, about one in ten, draws a fault that never ends instead.
    first = rng.random()
    if FOREVER_BAND[0] <= first < FOREVER_BAND[1]:
        return _forever(rng, net, profile)
    if MISFIT_BAND[0] <= first < MISFIT_BAND[1]:
        return misfit_plan(rng, net, profile)
    if clock_step.in_bands(first):
        step = clock_step.step_s(seed, net, profile)
        return FlowerFaults(net=net.name, clock_step_s=step) if step else None
    if IDLE_BAND[0] <= first < IDLE_BAND[1]:
        if profile.clean or net.kind != "static":
            return None
        return FlowerFaults(net=net.name, race_p=1.0, idle_blip=True)
    if not BAND[0] <= first < BAND[1]:
        return None
    # The race and the crash are faults: never in a clean world. Each fires at a start-run
    # now and then (a start-run is one of many steps; each firing adds a whole dispatch, or
    # an outage of minutes).
    race = rng.random() < 0.6 and not profile.clean
    crash = rng.random() < 0.6 and not profile.clean and net.keeps_jobs
    bad = rng.random() < 0.5
    kind = rng.choice(sorted(MALFORMED_FLOWER_APPS))
    at = round(rng.uniform(5.0, 120.0), 1)
    if not (race or crash or bad):
        return None
    return FlowerFaults(
        net=net.name,
        race_p=0.5 if race else 0.0,
        crash_p=0.8 if crash else 0.0,
        bad_app=kind if bad else None,
        bad_app_at=at,
    )


def _forever(rng: random.Random, net: NetSpec, profile: FaultProfile) -> FlowerFaults | None:
    """A fault that never ends: a fault (never in a clean world), on a scale-to-zero net
    only (an always-on one is never started to settle its strays). A stop refused for good
    leaves a run no restart ends only where a run pending at the SuperLink's death waits in
    its state database: DEAF needs one, GONE is drawn elsewhere."""
    roll = rng.random()
    at = round(rng.uniform(5.0, 120.0), 1)
    if profile.clean or net.kind == "static":
        return None
    kind = GONE if roll < 0.5 or not net.keeps_jobs else DEAF
    return FlowerFaults(net=net.name, forever=kind, forever_at=at)


def with_idle_net(seed: int, world: WorldSpec, profile: FaultProfile) -> WorldSpec:
    """An IDLE world (a fault: never a clean one): its Flower net always-on, a finished run
    releasing its job at once (RELEASE_AFTER=finished), so the net idles READY after it."""
    flower = [n for n in world.nets if n.backend == "flower"]
    first = random.Random(f"{seed}/flower-faults").random()
    if not flower or profile.clean or not IDLE_BAND[0] <= first < IDLE_BAND[1]:
        return world
    nets = tuple(
        dataclasses.replace(n, kind="static") if n.name == flower[0].name else n for n in world.nets
    )
    return dataclasses.replace(world, nets=nets, release_after="finished")


def misfit_plan(rng: random.Random, net: NetSpec, profile: FaultProfile) -> FlowerFaults | None:
    """The crash at a start-run (a state database, a scale-to-zero net: the stray it leaves
    is settled by starting the net), then the net's admin kit or service broken at its first
    settling start and mended by a human's restart of the workers (tests.sim.misfit)."""
    kind = rng.choice(("kit", "service"))
    fix_s = round(rng.uniform(60.0, 240.0), 1)
    if profile.clean or net.kind == "static" or not net.keeps_jobs:
        return None
    return FlowerFaults(net=net.name, crash_p=1.0, misfit=kind, misfit_fix_s=fix_s)


def with_flower_jobs(
    seed: int, world: WorldSpec, profile: FaultProfile, workload: Workload
) -> Workload:
    """The workload with the malformed app's job, where the seed draws one, then (last) a
    job pinned to the Flower net just before the horizon where it draws a fault that never
    ends: it waits behind the net's strays, which keep it off the net."""
    faults = plan(seed, world, profile)
    if faults is None:
        return workload
    jobs = workload.jobs
    if faults.bad_app is not None:
        bad = JobSpec(
            key=BAD_APP_KEY,
            arrive_s=faults.bad_app_at,
            duration_s=30.0,
            net=faults.net,
            definition=BAD_APP_DEFINITION,
        )
        jobs = (*jobs, bad)
    if faults.clock_step_s:
        jobs = (*jobs, *clock_step.jobs(seed, faults.net, workload))
    if faults.forever is not None or faults.misfit is not None:
        pinned = JobSpec(
            key=BEHIND_STRAY_KEY, arrive_s=workload.horizon_s - 1.0, duration_s=30.0, net=faults.net
        )
        jobs = (*jobs, pinned)
    return dataclasses.replace(workload, jobs=jobs)


class FlowerAdversary:
    """The race and the crash at the Flower net's start-runs, and the malformed app's bundle."""

    def __init__(self, sim: Simulation, faults: FlowerFaults) -> None:
        self.sim = sim
        self.faults = faults
        self.rng = random.Random(f"{sim.seed}/flower-faults/moments")
        self._seen: set[tuple[int, int]] = set()  # (message, point) already drawn for
        self._crash_due: int | None = None  # the message whose submit the crash follows
        # The race's outage: the SuperLink unreachable right after the lost start-run, long
        # enough to spend the failing step's retries, shorter than the server-lost grace
        # (its own stream: the race's seeds replay as before).
        self._outage_rng = random.Random(f"{sim.seed}/flower-faults/outage")
        self._outage_due: tuple[int, float] | None = None  # (message, seconds)
        self._forever_due = faults.forever is not None
        self._blip_job: str | None = None  # IDLE: the job whose end gives the lists back
        self._clock_back = ClockBack(sim, faults.net)  # armed once GONE begins
        step = faults.clock_step_s
        self._step = clock_step.ClockStep(sim, faults.net, step) if step else None
        if faults.bad_app is not None and sim.job_spec(str(job_id_for(BAD_APP_KEY))):
            folder = sim.local_bundle.folder.parent / BAD_APP_DEFINITION
            write_malformed_flower_app(folder, faults.bad_app)
            sim.trace(f"== bundle {BAD_APP_DEFINITION}: a Flower App, {faults.bad_app}")

    def at_hook(self, point: str, net: str | None) -> None:
        """Before a start-run of the Flower net: the race; right after it: the crash."""
        faults = self.faults
        if self._step is not None:
            self._step.at_hook(point, net)
        if net != faults.net or point not in POINTS:
            return
        sim = self.sim
        if len(sim.running) != 1 or sim.stalled is not None or sim.conn.in_transaction:
            return
        message = sim.current[-1]
        if not {"job_id", "net_name", "attempt"} <= message.kwargs.keys():
            return  # not a chain's step (a warm net's scale_up submits in the same task)
        if faults.misfit and str(message.kwargs["job_id"]) == str(job_id_for(BEHIND_STRAY_KEY)):
            return  # MISFIT's pinned job waits behind another job's stray (tests.sim.misfit)
        if point == "admin.submit.after" and faults.idle_blip:
            self._later_run_slower()
        if point == "admin.submit.after" and self._outage_due is not None:
            due, self._outage_due = self._outage_due, None
            if due[0] == message.id:
                self._outage(due[1])
        if point == "admin.submit" and faults.race_p:
            if (message.id, 0) not in self._seen and self.rng.random() < faults.race_p:
                self._race(message)
            self._seen.add((message.id, 0))
        elif point == "admin.submit.after" and self._deaf_due(message):
            self._crash_due = message.id
        elif (
            point == "admin.submit.after"
            and faults.crash_p
            # MISFIT's crash at every start-run (crash_p 1.0) only until faults stop (seed
            # 6684): after, every job on the net would crash at every attempt, none could
            # complete there, and its queue would drain only as each job spent all its
            # attempts (a grace and a settling start apiece), past any liveness bound. The
            # crash band's (0.8) go on after the drain: the safeguards' seeds 691 and 319
            # (and 499's) find their defects through those.
            and not (faults.misfit and sim.draining)
            and (message.id, 1) not in self._seen
            and self._pending_run()
        ):
            self._seen.add((message.id, 1))
            if self.rng.random() < faults.crash_p:
                self._crash_due = message.id
        elif point == "admin.server_start_time" and self._crash_due == message.id:
            # The start-run answered and the submit returned: the job adopts the run (its
            # start time asked next), and the SuperLink dies before its SuperExec claims it.
            self._crash_due = None
            if self._pending_run():
                if faults.forever == DEAF and self._forever_due:
                    self._refuse_stops()
                self._crash()

    def _deaf_due(self, message: Message) -> bool:
        """DEAF's moment: the first start-run after `forever_at` whose run is still pending."""
        faults, sim = self.faults, self.sim
        if faults.forever != DEAF or not self._forever_due or sim.clock.t < faults.forever_at:
            return False
        return not sim.draining and self._pending_run()

    def _refuse_stops(self) -> None:
        """From now on the SuperLink refuses every stop, and the pending run (its job's,
        waiting in the state database as the SuperLink dies) hangs once started: no restart
        ends it, since it revives with every SuperLink until a stop lands."""
        sim, server = self.sim, self.sim.cluster.servers[self.faults.net]
        assert isinstance(server, superlink.SuperLink)
        self._forever_due = False
        server.refuses_stops_from = sim.clock.t
        run = next(reversed(server.store.values()))
        run.duration_s = None
        net = self.faults.net
        sim.trace(f"== {net}'s SuperLink refuses every stop; run {run.nvflare_id} hangs")

    def after_step(self) -> None:
        """GONE begins at the first moment after `forever_at` (before the horizon) a job
        runs on the Flower net, its run live: from then on its SuperLink never answers (the
        job is lost, its run kept as a stray no one can settle), and the world is watched
        WATCH_S at rest."""
        sim, faults = self.sim, self.faults
        self._lists_back()
        self._clock_back.after_step()
        if self._step is not None:
            self._step.after_step()
        if faults.forever != GONE or not self._forever_due or sim.clock.t < faults.forever_at:
            return
        if sim.draining:
            return
        server = sim.cluster.servers[faults.net]
        if not isinstance(server, superlink.SuperLink):
            return
        t = sim.clock.t
        running = sim.conn.execute(
            "SELECT nvflare_job_id FROM jobs WHERE net_name = ? AND state = 'RUNNING'",
            (faults.net,),
        ).fetchone()
        run = server.store.get(running[0]) if running and running[0] else None
        if run is None or not run.live(t):
            return
        self._forever_due = False
        server.gone_from = t
        sim.rest_not_before = t + WATCH_S
        self._clock_back.arm(t)
        sim.trace(f"== {faults.net}'s SuperLink never answers again (its replica runs)")

    def _race(self, message: Message) -> None:
        """Another worker runs a copy of this dispatch (a step re-driven beside itself) to
        its end; if the job adopted its run, this start-run's reply is lost."""
        sim = self.sim
        broker = sim.broker
        broker._next_id += 1
        ids = {key: message.kwargs[key] for key in ("job_id", "net_name", "attempt")}
        copy = Message(broker._next_id, names.DISPATCH, ids, sim.clock.t, origin="adversary")
        slot = sim.running[-1]
        sim.trace(f"   || w{1 - slot} runs {copy.label()} beside it (the same attempt)")
        sim.deliver(copy, 1 - slot)
        job_id = str(message.kwargs["job_id"])
        row = sim.conn.execute(
            "SELECT nvflare_job_id, attempts, net_name, submit_token FROM jobs WHERE id = ?",
            (job_id.replace("-", ""),),
        ).fetchone()
        attempt, net = message.kwargs.get("attempt"), message.kwargs.get("net_name")
        if row is None or row[0] is None or (row[1], row[2]) != (attempt, net):
            return
        server = sim.cluster.servers[self.faults.net]
        if isinstance(server, superlink.SuperLink):
            server.lose_reply_of = row[3]
            sim.trace(f"   ~~ the job adopted run {row[0]}; this start-run's reply will be lost")
            if self.faults.idle_blip:
                self._refuse_lists(job_id)
                return
            if self._outage_rng.random() < OUTAGE_P:
                grace = sim.settings.server_lost_grace_s
                lasts = self._outage_rng.uniform(OUTAGE_MIN_S, max(OUTAGE_MIN_S, grace - 10.0))
                self._outage_due = (message.id, lasts)

    def _refuse_lists(self, job_id: str) -> None:
        """IDLE: from this lost start-run on, no list of the SuperLink's runs answers (the
        failing step's lookups fail until its retries are spent, each monitor round's list
        too) until the round that ends the job: the later run is left on the idle net."""
        server = self.sim.cluster.servers[self.faults.net]
        if self._blip_job is not None or not isinstance(server, superlink.SuperLink):
            return
        self._blip_job = job_id
        server.lists_refused = True
        self.sim.trace(f"== {self.faults.net}'s ListRuns refused until job {job_id[:8]} ends")

    def _later_run_slower(self) -> None:
        """IDLE: the raced start-run's run (its reply to be lost) trains once the first run
        is over (its SuperNodes busy with it), so it outlives the job."""
        server = self.sim.cluster.servers[self.faults.net]
        if not isinstance(server, superlink.SuperLink) or not server.store:
            return
        run = next(reversed(server.store.values()))
        if run.token == server.lose_reply_of and run.end_at is not None:
            run.end_at += LATER_RUN_EXTRA_S
            if run.duration_s is not None:
                run.duration_s += LATER_RUN_EXTRA_S

    def _lists_back(self) -> None:
        """IDLE: the lists answer again once the raced job left its run (after the step in
        which it ended: that round's list was refused)."""
        if self._blip_job is None:
            return
        server = self.sim.cluster.servers[self.faults.net]
        if not isinstance(server, superlink.SuperLink) or not server.lists_refused:
            return
        row = self.sim.conn.execute(
            "SELECT state FROM jobs WHERE id = ?", (self._blip_job.replace("-", ""),)
        ).fetchone()
        if row is not None and row[0] in ("ASSIGNED", "DISPATCHING", "RUNNING"):
            return
        server.lists_refused = False
        sim = self.sim
        sim.trace(f"== {self.faults.net}'s ListRuns answers again (job {row and row[0]})")
        # Watched past the later run's unaccounted bound: the world may be at rest before.
        sim.rest_not_before = max(sim.rest_not_before, sim.clock.t + 3 * sim.bounds.unaccounted)

    def _outage(self, lasts: float) -> None:
        """No one reaches the SuperLink for `lasts` seconds from the lost start-run on: the
        failing step's lookups fail until its retries are spent, and the job runs on (seed
        508's shape: only the monitor's stop of the runs its job does not count is left)."""
        sim = self.sim
        server = sim.cluster.servers[self.faults.net]
        sim.trace(f"== {self.faults.net}'s SuperLink unreachable for {lasts:.0f}s")
        server.partition(sim.clock.t, sim.clock.t + lasts)

    def _pending_run(self) -> bool:
        """The start-run just made a run that is still pending (its SuperExec has not
        claimed it yet)."""
        server = self.sim.cluster.servers[self.faults.net]
        if not server.store:
            return False
        run = next(reversed(server.store.values()))
        return superlink.record(run, self.sim.clock.t)[0] == "pending"

    def _crash(self) -> None:
        """The SuperLink dies with the run pending, down past the server-lost grace."""
        sim = self.sim
        grace = sim.settings.server_lost_grace_s
        down = grace + self.rng.uniform(30.0, 150.0)
        sim.trace(f"== {self.faults.net}'s SuperLink dies with a run pending ({down:.0f}s)")
        sim.cluster.crash(self.faults.net, sim.clock.t, down)


class BadAppWatch:
    """`malformed-app-refused`: the malformed app's job, once its first dispatch step begins
    (DISPATCHING), goes straight to FAILED `definition_invalid`: no retry, no requeue, never
    RUNNING, and no run of it on any server."""

    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        sim = observer.sim
        job_id = str(job_id_for(BAD_APP_KEY))
        spec = sim.job_spec(job_id)
        self.job_id = job_id if spec is not None and spec.definition == BAD_APP_DEFINITION else None
        self._event_id = 0
        self._dispatched = False
        self._done = False

    def check(self) -> None:
        """After every step: the job's new events, and any run of it."""
        if self.job_id is None or self._done:
            return
        sim = self.observer.sim
        for event_id, src, dst, reason in sim.conn.execute(
            "SELECT id, from_state, to_state, reason FROM job_events WHERE job_id = ? AND id > ?"
            " ORDER BY id",
            (self.job_id.replace("-", ""), self._event_id),
        ).fetchall():
            self._event_id = event_id
            if dst == "DISPATCHING":
                self._dispatched = True
            elif self._dispatched:
                self._settled(src, dst, reason)
                return
        run = next((r for r in sim.cluster.runs if r.job_id == self.job_id), None)
        if run is not None:
            self._report(f"run {run.nvflare_id} of it started on {run.net}")

    def at_end(self) -> None:
        """A job whose dispatch began must have ended by the horizon's drain."""
        if self.job_id is not None and self._dispatched and not self._done:
            self._report("its dispatch began and it never failed")

    def _settled(self, src: str, dst: str, reason: str) -> None:
        job_hex = str(self.job_id).replace("-", "")
        row = self.observer.sim.conn.execute(
            "SELECT reason_code FROM jobs WHERE id = ?", (job_hex,)
        ).fetchone()
        code = row[0] if row else None
        if dst != "FAILED" or code != "definition_invalid":
            self._report(f"{src} -> {dst} ({code}): {reason[:160]}")
        self._done = True

    def _report(self, text: str) -> None:
        self._done = True
        self.observer.report(INVARIANT, f"job {str(self.job_id)[:8]}", text)

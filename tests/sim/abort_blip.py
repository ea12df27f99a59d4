"""An abort that meets one error, and one that meets a lost submit reply (round 22, review
21b's D1 and D2): in bands of the first draw of `f"{seed}/abort-blip"` (about 4.9% of the
draw, none of the safeguards' and sweep-seed tests' seeds in them, so every other world
replays exactly; band worlds start at seed 539), flip-api sends one more job (`KEY`),
pinned to an NVFLARE net, once the faults have stopped (5-30 s past the horizon), so that
its server answers every call but the one this module fails; the job's run lasts past
ABORT_TIMEOUT_S. Two kinds (the band's second draw, half each):

- BLIP: STUCK_AFTER_S = ABORT_TIMEOUT_S (60 s), as the settings' defaults have them (300 s
  both); flip-api aborts the job the moment it is RUNNING, and the first abort command sent
  for it fails once with an unclassified error (`UnknownAdminError`, as a garbled answer;
  the server has not acted). Before 29fb0ed reconcile re-sent an ABORTING job's abort only
  past STUCK_AFTER_S, so with the two equal it never was: the run trained on and the job
  ended `abort_unconfirmed`.
- LOST: ABORT_TIMEOUT_S 120 s (STUCK_AFTER_S as the sweep has it, 40 s, so the re-sends
  come either way); the job's first submit lands and its reply is lost, and flip-api aborts
  it at that moment, the other worker taking the abort at once: it finds the submit held
  by its step, whose retry then finds the job ABORTING and sends nothing; from then no
  worker holds the submit and no run id is known. Before 29fb0ed nothing looked the run up
  by its token: it trained on and the job ended `abort_unconfirmed`.

`abort-unconfirmed-while-answering` (tests.sim.abort_invariants) finds both undone. The
aborts are never dropped or refused by the broker (and there are no faults by then)."""

from __future__ import annotations

import dataclasses
import functools
import random

from app import names
from app.errors import UnknownAdminError
from app.schemas import job_id_for
from app.sim.simulation import Simulation
from app.sim.workload import SITES, JobSpec, Workload, WorldSpec

# Gaps between the named seeds' draws of this stream (tests/unit/test_sweep_seeds.py,
# test_simulation*.py, test_*safeguards.py, test_*_sim.py: every seed they run, every
# integer listed in them, and 0-199; a margin of 0.0005 each side).
BANDS = (
    (0.0029, 0.0094),
    (0.1741, 0.1808),
    (0.1828, 0.1888),
    (0.5180, 0.5252),
    (0.7481, 0.7555),
    (0.8344, 0.8426),
    (0.9193, 0.9258),
)
STREAM = "abort-blip"
KEY = "abort-blip"  # the band's job
BLIP, LOST = "blip", "lost"
BLIP_P = 0.5
LOST_ABORT_TIMEOUT_S = 120.0  # room for the lease to lapse and a round or two after it


def in_bands(seed: int) -> bool:
    """Whether the seed's world sends the band's job."""
    first = random.Random(f"{seed}/{STREAM}").random()
    return any(lo <= first < hi for lo, hi in BANDS)


def kind_of(seed: int) -> str | None:
    """BLIP or LOST in a band world, None elsewhere."""
    if not in_bands(seed):
        return None
    rng = random.Random(f"{seed}/{STREAM}")
    rng.random()  # the band's draw
    return BLIP if rng.random() < BLIP_P else LOST


def with_abort_blip(seed: int, world: WorldSpec, workload: Workload) -> tuple[WorldSpec, Workload]:
    """A band world's settings (BLIP: STUCK_AFTER_S = ABORT_TIMEOUT_S; LOST: a longer
    ABORT_TIMEOUT_S) and its job, pinned to one of its NVFLARE nets; every other world (and a
    band world with no NVFLARE net) as it was."""
    kind = kind_of(seed)
    nvflare = [n.name for n in world.nets if n.backend == "nvflare"]
    if kind is None or not nvflare:
        return world, workload
    rng = random.Random(f"{seed}/{STREAM}/job")
    if kind == BLIP:
        world = dataclasses.replace(world, stuck_after_s=world.abort_timeout_s)
    else:
        world = dataclasses.replace(world, abort_timeout_s=LOST_ABORT_TIMEOUT_S)
    job = JobSpec(
        key=KEY,
        arrive_s=round(workload.horizon_s + rng.uniform(5.0, 30.0), 1),
        # Past ABORT_TIMEOUT_S from its abort: an abort never re-sent leaves it training.
        duration_s=round(world.abort_timeout_s + rng.uniform(60.0, 120.0), 1),
        net=rng.choice(nvflare),
        sites=SITES,
    )
    return world, dataclasses.replace(workload, jobs=(*workload.jobs, job))


class AbortBlip:
    """flip-api's abort of the band's job, and the error or lost reply it meets."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.kind = kind_of(sim.seed)
        self.job = next((j for j in sim.workload.jobs if j.key == KEY), None)
        self.job_id = str(job_id_for(KEY))
        self.blipped = False  # BLIP: the first abort command failed
        self.lost = False  # LOST: the submit's reply lost and the abort sent

    def schedule(self) -> None:
        """BLIP: the abort armed for the moment the job is RUNNING. The world stays up until
        the job has come (it arrives past the horizon)."""
        sim, job = self.sim, self.job
        if job is None:
            return
        sim.rest_not_before = max(sim.rest_not_before, job.arrive_s + 5.0)
        if self.kind != BLIP:
            return
        label = f"flip-api aborts {KEY}"
        arm = functools.partial(sim.caller.arm, self.job_id, "RUNNING", label, self._abort)
        sim.at(job.arrive_s, f"{label} once it is RUNNING", arm)

    def _abort(self) -> None:
        payload = {"job_id": self.job_id, "reason": "the user stops the run"}
        self.sim.broker.push(names.ABORT_JOB, {"payload": payload}, origin="flip-api", faulty=False)

    def _ours(self, task: str | None = None) -> bool:
        """The message being handled is the band job's (and `task`, if given; a submit is
        sent by the dispatch step or, chained, by the step before it)."""
        sim = self.sim
        if not sim.current:
            return False
        message = sim.current[-1]
        if task is not None and message.task != task:
            return False
        return str(message.kwargs.get("job_id")) == self.job_id

    def at_hook(self, point: str, net: str | None) -> None:
        """BLIP: the job's first abort command fails (the server has not acted). LOST: its
        first landed submit loses its reply, and flip-api aborts it right then."""
        if self.job is None or net is None or net != self.job.net:
            return
        sim = self.sim
        if self.kind == BLIP and not self.blipped and point == "admin.abort":
            if not self._ours(names.ABORT_ON_SERVER):
                return
            self.blipped = True
            sim.trace(f"== {net}: the first abort of {KEY} meets an error")
            raise UnknownAdminError(f"{net}: unclassified nvflare error, once (simulated)")
        if self.kind == LOST and not self.lost and point == "admin.submit.after":
            if not self._ours():
                return
            self.lost = True
            t = sim.clock.t
            sim.cluster.servers[net].reply_loss.append((t, t + 1e-6))  # this submit's only
            sim.trace(f"== {net}: {KEY}'s submit landed, its reply lost; flip-api aborts it")
            self._abort()
            if len(sim.running) == 1 and not sim.conn.in_transaction:
                # The other worker takes the abort at once: before the step's retry (its
                # countdown may be 0 s), which then finds the job ABORTING.
                message = sim.broker.pending[-1]
                sim.broker.take(message)
                sim.deliver(message, 1 - sim.running[-1])

"""A refused message's copies (round 22, d2c2629 and 98f9d8b): draws of the refusal-repeat
band (`tests.sim.refusal_repeat`) after all of its earlier ones, so every band world that
draws neither keeps its trajectory, and bands of those draws that none of the safeguards'
and sweep-seed tests' band seeds fall in. Each sends one payload under a key of this
module's own, whose definition is a folder of its own not there yet (refused), the base of
the band's workload job's payload (no prewarm hint: a job of its own):

- RACE (LATE worlds): at the refused message's record (the first session of
  `intake.refuse_enqueue`'s unit of work: the running message is this one and the
  exception being handled its judgement's InvalidRequest), the folder shows up and a copy of
  the message (a redelivery: the same task id) runs on the other worker right there: judged
  again, it creates the job, before the first copy records its refusal. Before d2c2629 the
  first copy then recorded it (`caller_key_conflict`) and a `rejected` event: one message
  answered a job and `rejected`.
- ODD: flip-api names the message's task id itself (`send_task(task_id=...)`): longer than
  refused_messages.message_id's 255 characters, or holding a NUL or a lone surrogate
  (`Message.named_id`). Once it is answered `rejected` the folder shows up, and a duplicate
  delivery (the same task id) comes 1-4 s later. Before 98f9d8b such an id was not recorded
  (`enqueue.recordable_message_id` None), so the copy, judged again, created the job.

`check` (`one-refusal-per-request`, at the end): every copy of each of these messages is
answered alike (never `rejected` and a job), and no key of this module's both names a job
and a recorded refusal (each carries one message, so that is one request both)."""

from __future__ import annotations

import dataclasses
import random
import sys
from typing import TYPE_CHECKING, Any

from app import names
from app.errors import InvalidRequest
from app.sim.simulation import Simulation
from app.usecases import intake

if TYPE_CHECKING:
    from tests.sim.refusal_repeat import Plan

# Bands of each new draw (about half of it), none of the named band seeds' draws in them
# (427, 432, 652, 945 of test_refusal_repeat_sim.py; 3524, 5996, 8249, 8446, 9280 of
# test_sweep_seeds.py), so those worlds replay exactly.
RACE_BANDS = ((0.0, 0.1700), (0.1730, 0.3450), (0.7000, 0.8700))
ODD_BANDS = ((0.0600, 0.2040), (0.2070, 0.3220), (0.5730, 0.7180), (0.7210, 0.8210))
RACE_KEY = "refusal-race-0"
ODD_KEY = "refusal-odd-0"
LONG, NUL, SURROGATE = "longer than 255", "a NUL", "a lone surrogate"
ODD_KINDS = (LONG, NUL, SURROGATE)


@dataclasses.dataclass
class Race:
    """What this module sends in a band world."""

    race_s: float | None  # RACE: its payload's send, or None
    odd_s: float | None  # ODD: its payload's send, or None
    odd_kind: str
    odd_id: str  # the task id flip-api names for it
    odd_copy_s: float  # its duplicate, this long after the folder shows up
    task_ids: dict[str, int] = dataclasses.field(default_factory=dict)  # key -> its message


def _in(draw: float, bands: tuple[tuple[float, float], ...]) -> bool:
    return any(lo <= draw < hi for lo, hi in bands)


def _odd_id(seed: int, kind: str, token: str) -> str:
    head = f"flip-api-{seed}-{token}"
    if kind == LONG:
        return head + "-" + token * 16  # 300 characters and more
    if kind == NUL:
        return f"{head}\x00{token}"
    return f"{head}\ud800"


class RefusalRace:
    """RACE and ODD in a band world: their sends, the race's moment, their check."""

    def __init__(self, sim: Simulation, plan: Plan, rng: random.Random) -> None:
        self.sim = sim
        self.base = {**plan.refused[0], "net": plan.job.net}
        if plan.job.net is None:
            self.base.pop("net")
        self.base.pop("prewarm_key", None)
        self.first_s = plan.first_s
        race_draw, odd_draw = rng.random(), rng.random()
        race_after, odd_after = round(rng.uniform(0.3, 5.0), 1), round(rng.uniform(0.3, 5.0), 1)
        kind = rng.choice(ODD_KINDS)
        token = f"{rng.getrandbits(64):016x}"
        copy_s = round(rng.uniform(1.0, 4.0), 1)
        race = plan.kind == "LATE" and _in(race_draw, RACE_BANDS)
        self.race = Race(
            round(plan.first_s + race_after, 1) if race else None,
            round(plan.first_s + odd_after, 1) if _in(odd_draw, ODD_BANDS) else None,
            kind,
            _odd_id(sim.seed, kind, token),
            copy_s,
        )
        self.draws = (race_draw, odd_draw)  # (the bands chosen around the named seeds)
        self._raced = False

    def _payload(self, key: str, folder: str) -> dict[str, Any]:
        return {**self.base, "caller_key": key, "definition": f"{folder}-{self.sim.seed}"}

    def schedule(self) -> None:
        """flip-api's sends of RACE's and ODD's payloads."""
        race, sim = self.race, self.sim
        if race.race_s is not None:
            sim.at(race.race_s, f"flip-api enqueues {RACE_KEY} (LATE)", self._send_race)
        if race.odd_s is not None:
            label = f"flip-api enqueues {ODD_KEY} (LATE) under a task id {race.odd_kind}"
            sim.at(race.odd_s, label, self._send_odd)

    def _send(self, payload: dict[str, Any], named_id: str = "") -> int:
        """One message of flip-api's, never refused, dropped nor duplicated by the broker."""
        broker = self.sim.broker
        kwargs = {"payload": payload}
        broker.push(names.ENQUEUE_JOB, kwargs, origin="flip-api", faulty=False, named_id=named_id)
        task_id = broker.pending[-1].task_id
        self.race.task_ids[str(payload["caller_key"])] = task_id
        return task_id

    def _send_race(self) -> None:
        """RACE's message (refused: no folder yet; its record is `at_hook`'s moment)."""
        self._send(self._payload(RACE_KEY, "race"))

    def _send_odd(self) -> None:
        """ODD's message under its named task id; once refused, the folder and a copy."""
        sim, race = self.sim, self.race
        payload = self._payload(ODD_KEY, "odd")
        task_id = self._send(payload, race.odd_id)

        def refused() -> str:
            return "REFUSED" if "rejected" in sim.delivery.answers.get(task_id, []) else ""

        def upload_and_copy() -> None:
            upload(sim, str(payload["definition"]))
            sim.trace(f"== a duplicate of message {task_id} comes in {race.odd_copy_s}s")
            sim.broker.push(
                names.ENQUEUE_JOB,
                {"payload": payload},
                origin="flip-api",
                faulty=False,
                delay=race.odd_copy_s,
                task_id=task_id,
                named_id=race.odd_id,
            )

        label = f"the folder shows up once message {task_id} ({ODD_KEY}) was refused"
        sim.caller.arm(refused, "REFUSED", label, upload_and_copy)

    def at_hook(self, point: str) -> None:
        """RACE's moment: the refused message's record opens its session; the folder shows
        up and a copy of the message runs on the other worker first."""
        sim, race = self.sim, self.race
        if self._raced or race.race_s is None or point != "db.session" or not sim.current:
            return
        message = sim.current[-1]
        if message.task != names.ENQUEUE_JOB or message.task_id != race.task_ids.get(RACE_KEY):
            return
        judged = sys.exc_info()[1]  # the judgement being handled: `requests.enqueue_job`'s
        if not isinstance(judged, InvalidRequest) or isinstance(judged, intake.RefusedBefore):
            return
        if (
            len(sim.running) != 1
            or sim.stalled is not None
            or sim.conn.in_transaction
            or not sim.delivery.in_handler()
            or sim.broker.down_until(sim.clock.t) is not None
        ):
            return
        self._raced = True
        upload(sim, str(message.kwargs["payload"]["definition"]))
        other = 1 - sim.running[-1]
        sim.trace(f"== a copy of message {message.task_id} runs on w{other} before its record")
        sim.broker.push(
            message.task,
            message.kwargs,
            origin="flip-api",
            faulty=False,
            task_id=message.task_id,
            named_id=message.named_id,
        )
        copy = sim.broker.pending[-1]
        sim.broker.take(copy)
        sim.deliver(copy, other)

    def check(self) -> None:
        """`one-refusal-per-request` for RACE's and ODD's messages."""
        sim = self.sim
        for key, task_id in self.race.task_ids.items():
            refused_and_a_job(sim, task_id, f"flip-api's message {task_id} ({key})")
            (refusals,) = sim.conn.execute(
                "SELECT count(*) FROM rejected_requests WHERE caller_key = ?", (key,)
            ).fetchone()
            (jobs,) = sim.conn.execute(
                "SELECT count(*) FROM jobs WHERE caller_key = ?", (key,)
            ).fetchone()
            if refusals and jobs:
                sim.report(
                    "one-refusal-per-request",
                    f"caller_key {key}",
                    f"one message's request both a job and refused ({refusals} refusals)",
                )


def upload(sim: Simulation, definition: str) -> None:
    """The definition's folder shows up: a link to the local definition's (a job from it
    carries that bundle's versions, as the checker reads them)."""
    folder = sim.settings.job_root / definition
    if not folder.exists():
        folder.symlink_to(sim.local_bundle.folder.resolve(), target_is_directory=True)
    sim.trace(f"== the folder {definition} shows up under JOB_ROOT")


def refused_and_a_job(sim: Simulation, task_id: int, subject: str) -> None:
    """`one-refusal-per-request`: the copies of one message were not answered both
    `rejected` and a job."""
    answers = sim.delivery.answers.get(task_id, [])
    if "rejected" in answers and "job" in answers:
        sim.report(
            "one-refusal-per-request",
            subject,
            f"copies of one message answered {answers} (rejected and a job)",
        )

"""One refusal per request (round 17, d406103 and migration 0022): in bands of the first draw
of `f"{seed}/refusal-repeat"` (about 6.5% of the worlds; none of the safeguards' and
sweep-seed tests' seeds in them, so every other world replays exactly), flip-api sends a
refused enqueue under the key of one workload job before that job's own (the corrected
request): its definition a folder not there yet (LATE) or an unknown net (NET). In two of
three worlds the refusal's commit is applied and its reply lost (the handler's retry runs),
and in LATE the definition's folder shows up at that moment (an upload a network file
system shows late). In NET worlds flip-api may send a second, different refused payload
under the key (another priority: the same reason). Once the corrected request stored its
job, flip-api may repeat the first payload as it was (a new message), in some worlds. In
some worlds flip-api also sends a keyless refused payload whose refusal's reply is lost.
Copies (round 18, draws after those): in LATE worlds whose first refusal's reply is not
lost (where the folder never showed up) flip-api repeats the first payload early (a new
message, refused: no folder yet), the folder shows up once that repeat was answered, and a
duplicate delivery of the repeat (its task id) comes 1-4 s later, before the corrected
request; in half the worlds with the late repeat, a duplicate of it comes after it. There
flip-api also sends the first payload under a key of the module's own (`OWN_KEY`, refused
too), sends it again once the folder shows up (a new message, judged again: its job), and a
duplicate of the refused message comes 1-4 s after (answered with its refusal, not as the
job's repeat). The folder is a link to the local definition's (its bundle versions).

`one-refusal-per-request` (at the end of a run, `check`): each distinct refused payload
under the key is recorded once (one row, one `rejected` event at most where CALLBACK_URL is
on), the keyless one once; no job stored under the key is a refused request (its
`sent_digest`); no payload already refused is recorded again as `caller_key_conflict`.
Undone: the retry answered from its message's refusal (D1: the retry creates the job),
the payload's digest in the match (D2: the second payload swallowed; D3: the late repeat a
second refusal, `caller_key_conflict`), the handler's message id (0022: the keyless
refusal recorded twice), every message a refusal answered kept (3201f00: the early
repeat's copy creates the job). Every copy of one of its messages (one task id) is answered
alike: never `rejected` and then a job."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import random
import sqlite3
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from app import names
from app.errors import InvalidRequest
from app.schemas import EnqueueJob, job_id_for
from app.sim.bundles import LOCAL_DEFINITION, S3_DEFINITION
from app.sim.simulation import Simulation
from app.sim.workload import JobSpec
from app.usecases import intake
from tests.sim.dbfaults import DB_ERROR
from tests.sim.refusal_race import RefusalRace, refused_and_a_job, upload

# Gaps between the named seeds' draws of this stream (tests/unit/test_sweep_seeds.py,
# test_simulation*.py, test_*safeguards.py, test_*_sim.py: every seed they run, and every
# integer listed in them, with a margin).
BANDS = (
    (0.1687, 0.1798),
    (0.3767, 0.3879),
    (0.6503, 0.6612),
    (0.6744, 0.6838),
    (0.9369, 0.9468),
    (0.9750, 0.9874),
)
STREAM = "refusal-repeat"
LEAD_S = (10.0, 20.0)  # the refused payload goes this long before the corrected request
UNKNOWN_NET = "net-unknown"
OWN_KEY = "refusal-copy-0"  # the module's own key: its job comes from a payload once refused
MARKER = "refusal_repeat_marker"  # the keyless payload's extra field, named in its reason
STORED = "STORED"


def in_bands(seed: int) -> bool:
    """Whether the seed's world sends the refused requests."""
    first = random.Random(f"{seed}/{STREAM}").random()
    return any(lo <= first < hi for lo, hi in BANDS)


def digest(payload: Any) -> str:
    """The payload as sent, keys sorted (the README's "byte for byte once its keys are
    sorted"): the harness's own reading, not the product's."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass
class Plan:
    """What flip-api sends in a band world."""

    job: JobSpec
    kind: str  # LATE or NET
    refused: list[dict[str, Any]]  # the distinct refused payloads under the key, in order
    lost: bool  # the first refusal's commit reply lost
    repeat: bool  # the first payload sent again once the corrected request stored its job
    keyless: dict[str, Any] | None
    first_s: float
    copies: bool = False  # LATE, not lost: an early repeat, the upload on its answer, a copy
    early_s: float = 0.0  # the early repeat, this long after the first payload
    copy_after_s: float = 0.0  # its copy, this long after its answer
    late_copy_s: float | None = None  # the late repeat's copy, this long after it
    own_copy_s: float = 0.0  # the duplicate of OWN_KEY's refused message, after its job
    sent_ids: list[int] = dataclasses.field(default_factory=list)  # task ids of its sends


class RefusalRepeat:
    """Sends the refused requests of a band world and loses their commits' replies."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.plan: Plan | None = None
        self.race: RefusalRace | None = None  # round 22's copies (tests.sim.refusal_race)
        self._lose: list[dict[str, Any]] = []  # the payloads whose next refusal loses its reply
        if not in_bands(sim.seed):
            return
        rng = random.Random(f"{sim.seed}/{STREAM}")
        rng.random()  # the band's draw
        jobs = self._candidates()
        if not jobs:
            return
        job = rng.choice(jobs)
        kind = rng.choice(("LATE", "NET"))
        base = sim.caller.enqueue_payload(job)
        if kind == "LATE":
            first = {**base, "definition": f"late-{sim.seed}"}
        else:
            first = {**base, "net": UNKNOWN_NET}
        refused = [first]
        if kind == "NET" and rng.random() < 0.6:
            refused.append({**first, "priority": 7 if job.priority != 7 else 8})
        lost = rng.random() < 2 / 3
        repeat = rng.random() < 0.6
        keyless = None
        if rng.random() < 0.4:
            keyless = {
                "definition": LOCAL_DEFINITION,
                "required_sites": list(job.sites),
                MARKER: sim.seed,
            }
        first_s = round(max(0.0, job.arrive_s - rng.uniform(*LEAD_S)), 1)
        self.plan = Plan(job, kind, refused, lost, repeat, keyless, first_s)
        # Round 18's draws, after the others (the band's worlds keep their earlier draws).
        early_s, copy_after_s = round(rng.uniform(0.5, 2.0), 1), round(rng.uniform(1.0, 4.0), 1)
        late_copy = rng.random() < 0.5
        late_copy_s = round(rng.uniform(1.0, 30.0), 1)
        self.plan.copies = kind == "LATE" and not lost  # the lost commit's upload is D1's
        self.plan.early_s, self.plan.copy_after_s = early_s, copy_after_s
        self.plan.late_copy_s = late_copy_s if repeat and late_copy else None
        self.plan.own_copy_s = round(rng.uniform(1.0, 4.0), 1)
        self.race = RefusalRace(sim, self.plan, rng)  # round 22's draws, after those
        self._own_first: int | None = None  # OWN_KEY's refused message
        self._lose = [p for p in (first if lost else None, keyless) if p is not None]
        if self._lose:
            event.listen(sim.engine, "commit", self._on_commit)

    def _candidates(self) -> list[JobSpec]:
        """Workload jobs the product takes, sent by the caller at their time, late enough."""
        sim = self.sim
        later = {k for b in sim.workload.bursts for k in (b.plain, b.hinted)}
        every = set.intersection(*(set(n.sites) for n in sim.world.nets))
        nets = {n.name for n in sim.world.nets}
        return [
            j
            for j in sim.workload.jobs
            if j.key not in later
            and j.arrive_s >= LEAD_S[1]
            and set(j.sites) <= every
            and (j.net is None or j.net in nets)
            and j.definition in (LOCAL_DEFINITION, S3_DEFINITION)
            and self._takes(j)
        ]

    def _takes(self, job: JobSpec) -> bool:
        try:
            intake.parse_payload(EnqueueJob, self.sim.caller.enqueue_payload(job))
        except InvalidRequest:
            return False
        return True

    def schedule(self) -> None:
        """flip-api's sends: the refused payloads, the keyless one, the armed repeat."""
        plan, sim = self.plan, self.sim
        if plan is None:
            return
        key = plan.job.key
        t = plan.first_s
        for i, payload in enumerate(plan.refused):
            what = "refused" if i == 0 else "another refused"
            sim.at(t + i, f"flip-api enqueues {key}, {what} ({plan.kind})", self._send(payload))
        if plan.keyless is not None:
            sim.at(t + 0.5, "flip-api enqueues a keyless refused payload", self._send(plan.keyless))
        if plan.copies:
            sim.at(t + 0.2, f"flip-api enqueues {OWN_KEY} ({plan.kind})", self._send_own)
            early = functools.partial(self._send_early, plan.refused[0])
            sim.at(t + plan.early_s, f"flip-api repeats {key}'s refused payload early", early)
        if plan.repeat:
            label = f"flip-api repeats {key}'s refused payload as it was"
            stored = functools.partial(_stored, sim, str(job_id_for(key)).replace("-", ""))
            send = self._send(plan.refused[0], copy_s=plan.late_copy_s)
            sim.at(
                t,
                f"{label}, once stored",
                functools.partial(sim.caller.arm, stored, STORED, label, send),
            )
        if self.race is not None:
            self.race.schedule()

    def at_hook(self, point: str) -> None:
        """Round 22's race at a refused message's record (tests.sim.refusal_race)."""
        if self.race is not None:
            self.race.at_hook(point)

    def _send(self, payload: dict[str, Any], copy_s: float | None = None) -> Callable[[], None]:
        """flip-api's send, never refused nor dropped by the broker (a refused send_task is
        sent again; a message lost on the way would leave nothing to count); `copy_s`: a
        duplicate delivery of it (the same task id) that long after."""
        sent = json.loads(json.dumps(payload))

        def send() -> None:
            task_id = self._push(sent)
            if copy_s is not None:
                self.sim.trace(f"== a duplicate of message {task_id} comes in {copy_s}s")
                self._push(sent, copy_s, task_id)

        return send

    def _push(self, payload: dict[str, Any], delay: float = 0.0, task_id: int | None = None) -> int:
        """One message on the broker; its Celery task id."""
        broker = self.sim.broker
        kwargs = {"payload": payload}
        broker.push(
            names.ENQUEUE_JOB, kwargs, origin="flip-api", faulty=False, delay=delay, task_id=task_id
        )
        sent_as = broker.pending[-1].task_id  # never refused, dropped nor coalesced
        if self.plan is not None and sent_as not in self.plan.sent_ids:
            self.plan.sent_ids.append(sent_as)
        return sent_as

    def _own(self) -> dict[str, Any]:
        """The first payload under OWN_KEY, no prewarm hint (a job of its own)."""
        assert self.plan is not None
        own = {**self.plan.refused[0], "caller_key": OWN_KEY}
        own.pop("prewarm_key", None)
        return own

    def _send_own(self) -> None:
        """The first payload under OWN_KEY (refused: no folder yet)."""
        self._own_first = self._push(self._own())

    def _send_early(self, payload: dict[str, Any]) -> None:
        """flip-api's early repeat (refused: no folder yet); once it is answered, the
        folder shows up and a duplicate delivery of it follows (break-it 3's copy of a
        repeat matched to an earlier refusal)."""
        sim, plan = self.sim, self.plan
        assert plan is not None
        sent = json.loads(json.dumps(payload))
        task_id = self._push(sent)
        sent_before = list(plan.sent_ids)  # the first payload, the keyless one, this repeat

        def answered() -> str:
            # Every send so far refused (a broker outage may deliver them in any order).
            answers = sim.delivery.answers
            done = all("rejected" in answers.get(i, []) for i in sent_before)
            return "ANSWERED" if done else ""

        def upload_and_copy() -> None:
            self._upload(str(payload["definition"]))
            sim.trace(f"== a duplicate of message {task_id} comes in {plan.copy_after_s}s")
            self._push(sent, plan.copy_after_s, task_id)
            if self._own_first is not None:
                # Judged again: its job. Then a copy of the refused message under the key.
                self._push(self._own())
                sim.trace(f"== a duplicate of message {self._own_first} in {plan.own_copy_s}s")
                self._push(self._own(), plan.own_copy_s, self._own_first)

        label = f"the folder shows up once messages {sent_before} were refused"
        sim.caller.arm(answered, "ANSWERED", label, upload_and_copy)

    def _on_commit(self, conn: Any) -> None:
        sim = self.sim
        # The refusal's own commit, in its handler: not the worker start's after a kill
        # during it (seed 5996: the start's commit was taken for the refusal's).
        if not self._lose or not sim.current or not sim.delivery.in_handler():
            return
        message = sim.current[-1]
        payload = message.kwargs.get("payload")
        if message.task != names.ENQUEUE_JOB or payload not in self._lose:
            return
        self._lose.remove(payload)
        conn.connection.dbapi_connection.commit()  # applied; the reply never comes back
        plan = self.plan
        if plan is not None and plan.kind == "LATE" and payload == plan.refused[0]:
            self._upload(str(payload["definition"]))
        sim.trace("== a refusal's commit applied, its reply lost")
        raise OperationalError("COMMIT", None, sqlite3.OperationalError(DB_ERROR))

    def _upload(self, definition: str) -> None:
        upload(self.sim, definition)

    def stop(self) -> None:
        """Take the listener off the process's shared engine."""
        if self.plan is not None and (self.plan.lost or self.plan.keyless is not None):
            event.remove(self.sim.engine, "commit", self._on_commit)


def _stored(sim: Simulation, job_hex: str) -> str:
    row = sim.conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_hex,)).fetchone()
    return STORED if row is not None else ""


def sent_digests(plan: Plan | None) -> frozenset[str]:
    """The digests of the refused payloads flip-api sent under a workload job's key."""
    return frozenset(digest(p) for p in plan.refused) if plan is not None else frozenset()


def one_refusal_per_request(sim: Simulation, plan: Plan | None) -> None:
    """`one-refusal-per-request`: each distinct refused request recorded once, none a job."""
    if plan is None:
        return
    key, conn = plan.job.key, sim.conn
    rows = conn.execute(
        "SELECT id, reason_code, payload_digest FROM rejected_requests WHERE caller_key = ?"
        " ORDER BY id",
        (key,),
    ).fetchall()
    subject = f"caller_key {key}"
    digests = [digest(p) for p in plan.refused]
    # Only this module's payloads: the workload's own request under the key may be refused
    # too, for its world's reasons (a redeploy removed its net: ops 3524, 8249, servers 8446),
    # a refusal of its own.
    rows = [r for r in rows if r[2] in digests]
    if sorted(r[2] for r in rows) != sorted(digests):
        codes = [str(r[1]) for r in rows]
        sim.report(
            "one-refusal-per-request",
            subject,
            f"{len(plan.refused)} distinct refused payloads sent ({plan.kind}), "
            f"{len(rows)} refusals of them recorded {codes}",
        )
    first_code = {d: str(c) for _, c, d in reversed(rows) if d is not None}
    for _, code, kept in rows:
        if str(code) == "caller_key_conflict" and kept in digests and first_code[kept] != code:
            sim.report(
                "one-refusal-per-request", f"{subject} again", "a refused payload again, a conflict"
            )
    sent = {intake.parse_payload(EnqueueJob, p).sent_digest() for p in plan.refused}
    job = conn.execute(
        "SELECT sent_digest, state FROM jobs WHERE id = ?",
        (str(job_id_for(key)).replace("-", ""),),
    ).fetchone()
    if job is not None and job[0] in sent:
        sim.report(
            "one-refusal-per-request",
            f"{subject} as a job",
            f"a request answered rejected became a job ({job[1]})",
        )
    for task_id in plan.sent_ids:
        refused_and_a_job(sim, task_id, f"flip-api's message {task_id}")
    if sim.world.callbacks:
        ids = {f"rejected-{r[0]}" for r in rows}
        got = sum(1 for e in sim.receiver.rejected_keys if e in ids)
        if got > len(plan.refused):
            sim.report("one-refusal-per-request", f"{subject} events", f"{got} rejected events")
    if plan.keyless is not None:
        (count,) = conn.execute(
            "SELECT count(*) FROM rejected_requests WHERE caller_key IS NULL AND reason LIKE ?",
            (f"%{MARKER}%",),
        ).fetchone()
        if count != 1:
            sim.report("one-refusal-per-request", "a keyless request", f"recorded {count} times")

"""Python values through Celery's serializer (round 17, 8025614): in bands of the first draw
of `f"{seed}/kombu-values"` (about 5.8% of the worlds; none of the safeguards' and
sweep-seed tests' seeds in them, so every other world replays exactly), a Python flip-api
sends what kombu's json carries as a typed value and decodes back to that Python object on
the worker (`app.sim.messages.carried`):

- MODEL: an enqueue whose metadata holds FLIP's `model_id` as a `uuid.UUID` (refused: the
  metadata is not JSON). Before 8025614 `json.dumps` in `EnqueueJob._metadata` raised a
  TypeError, which pydantic passes through: the request failed, acknowledged away, with no
  job, no refusal and no `rejected` event (F1).
- WHEN: two different payloads under one key, each with a `datetime` where a string is
  expected (the definition, the net or the project id), refused for the same reason; in
  half the worlds flip-api sends the first again (a new message: the same request). Before
  8025614 such a payload had no digest (`enqueue.payload_digest`), so the second payload
  was taken for the first and merged into its refusal (F2).
- KEY (round 18, draws after those): a payload whose caller_key is a `uuid.UUID` (flip-api
  sending its run's id as a key), refused (not a string), and sent again (a new message:
  the same request). Before 4811fde the refusal was recorded keyless (`caller_key_of` read
  only str and bytes): the request's key names no refusal, and its repeat is another.
- NUMBER (round 20, draws after those): a payload whose caller_key is a JSON number, sent
  twice. Before e7ea82e the refusal was recorded keyless, as the UUID key's was.
- SHAPE (round 20): an otherwise valid enqueue under `kombu-shape-0` sent by name in
  another shape than its one `payload` kwarg (one of `SHAPES`: its fields as the kwargs,
  the payload positional, or an extra positional argument; `Message.args`), in half the
  worlds twice, and in half of them the corrected request (the payload kwarg) after it: a
  job. Before 487ce8d the handler's call raised a TypeError: failed, acknowledged away,
  neither a job nor a refusal (`no-escape`, `request-lost`, `request-kept`).

Its sends, and their retries, are never refused, dropped or duplicated by the broker
(`Message.faulty`; seed 7487 lost a retry). `request-kept` (at the end, `check`): every
enqueue flip-api sent ends as a job or a recorded refusal, and each distinct refused
payload under a key is recorded once (one row; at most that many
`rejected` events where CALLBACK_URL is on), a UUID or number key under its text, and
a corrected request is a job."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from app import names
from app.sim.bundles import LOCAL_DEFINITION, S3_DEFINITION
from app.sim.simulation import Simulation
from tests.sim.gone_bundle import GoneBundle

# Gaps between the named seeds' draws of this stream (tests/unit/test_sweep_seeds.py,
# test_simulation*.py, test_*safeguards.py, test_*_sim.py: every seed they run, every
# integer listed in them, and 0-199; a margin of 0.0005 each side).
BANDS = (
    (0.1652, 0.1725),
    (0.2127, 0.2190),
    (0.2573, 0.2640),
    (0.5090, 0.5159),
    (0.7121, 0.7189),
    (0.8315, 0.8378),
    (0.9518, 0.9632),
    (0.9898, 0.9962),
)
STREAM = "kombu-values"
MODEL_KEY = "kombu-model-0"
WHEN_KEY = "kombu-when-0"
WHEN_FIELDS = ("definition", "net", "project_id")
SHAPE_KEY = "kombu-shape-0"
# How a caller sending the task by name may misshape it: its fields as the kwargs, the
# payload as the one positional argument, or the payload kwarg and an extra positional one.
FIELDS, POSITIONAL, EXTRA = "fields as kwargs", "payload positional", "an extra positional"
SHAPES = (FIELDS, POSITIONAL, EXTRA)


def in_bands(seed: int) -> bool:
    """Whether the seed's world sends the Python values."""
    first = random.Random(f"{seed}/{STREAM}").random()
    return any(lo <= first < hi for lo, hi in BANDS)


@dataclasses.dataclass
class Send:
    """One of flip-api's enqueues: when, under which key, what (Python objects)."""

    at_s: float
    label: str
    payload: dict[str, Any]
    shape: str = ""  # "": sent as its one `payload` kwarg; else one of SHAPES


@dataclasses.dataclass
class Plan:
    """What flip-api sends in a band world, and the distinct payloads under each key."""

    sends: list[Send]
    distinct: dict[str, int]  # caller_key -> distinct payloads sent under it
    jobs: set[str] = dataclasses.field(default_factory=set)  # keys that must end as a job


class KombuValues:
    """Sends a band world's enqueues holding Python values; checks what became of them."""

    def __init__(self, sim: Simulation, gone: GoneBundle | None = None) -> None:
        self.sim = sim
        self._gone = gone  # the world's gone-bundle band, whose folder gap refuses rightly
        self.plan: Plan | None = None
        if not in_bands(sim.seed):
            return
        rng = random.Random(f"{sim.seed}/{STREAM}")
        rng.random()  # the band's draw
        every = set.intersection(*(set(n.sites) for n in sim.world.nets))
        sites = sorted(every)[:1] or ["site-1"]
        definition = rng.choice((LOCAL_DEFINITION, S3_DEFINITION))
        base: dict[str, Any] = {"definition": definition, "required_sites": sites}
        model = uuid.UUID(int=rng.getrandbits(128), version=4)
        model_s = round(rng.uniform(0.0, 120.0), 1)
        sends = [
            Send(
                model_s,
                f"flip-api enqueues {MODEL_KEY} (metadata.model_id a UUID)",
                {**base, "caller_key": MODEL_KEY, "metadata": {"model_id": model, "round": 1}},
            )
        ]
        field = rng.choice(WHEN_FIELDS)
        when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(10**7))
        first = {**base, "caller_key": WHEN_KEY, field: when}
        second = {**first, field: when + timedelta(minutes=rng.randint(1, 600))}
        when_s = round(rng.uniform(0.0, 120.0), 1)
        label = f"flip-api enqueues {WHEN_KEY} ({field} a datetime"
        sends.append(Send(when_s, f"{label})", first))
        sends.append(Send(round(when_s + rng.uniform(0.5, 30.0), 1), f"{label}, another)", second))
        if rng.random() < 0.5:
            again = round(when_s + rng.uniform(30.0, 90.0), 1)
            sends.append(Send(again, f"{label}, the first again)", dict(first)))
        self.plan = Plan(sends, {MODEL_KEY: 1, WHEN_KEY: 2})
        # Round 18's draws, after the others (the band's worlds keep their earlier draws).
        key = uuid.UUID(int=rng.getrandbits(128), version=4)
        key_s = round(rng.uniform(0.0, 120.0), 1)
        again_s = round(key_s + rng.uniform(0.5, 60.0), 1)
        keyed = {**base, "caller_key": key}
        sends.append(Send(key_s, f"flip-api enqueues {key} (caller_key a UUID)", keyed))
        sends.append(Send(again_s, f"flip-api enqueues {key} (caller_key a UUID), again", keyed))
        self.plan.distinct[str(key)] = 1
        # Round 20's draws, after the others (the band's worlds keep their earlier draws).
        number = rng.randrange(10**6, 10**15)
        number_s = round(rng.uniform(0.0, 120.0), 1)
        numbered = {**base, "caller_key": number}
        label = f"flip-api enqueues {number} (caller_key a JSON number)"
        sends.append(Send(number_s, label, numbered))
        sends.append(Send(round(number_s + rng.uniform(0.5, 60.0), 1), f"{label}, again", numbered))
        self.plan.distinct[str(number)] = 1
        shape = rng.choice(SHAPES)
        shaped = {**base, "caller_key": SHAPE_KEY}
        shape_s = round(rng.uniform(0.0, 120.0), 1)
        label = f"flip-api enqueues {SHAPE_KEY} ({shape})"
        sends.append(Send(shape_s, label, shaped, shape))
        if rng.random() < 0.5:
            again = round(shape_s + rng.uniform(0.5, 60.0), 1)
            sends.append(Send(again, f"{label}, again", shaped, shape))
        self.plan.distinct[SHAPE_KEY] = 1
        if rng.random() < 0.5:
            # The corrected request: the same fields as its one `payload` kwarg, a job.
            fixed = round(shape_s + rng.uniform(60.0, 120.0), 1)
            sends.append(Send(fixed, f"flip-api enqueues {SHAPE_KEY} (as its payload)", shaped))
            self.plan.jobs.add(SHAPE_KEY)

    def schedule(self) -> None:
        """flip-api's sends, at their times."""
        if self.plan is None:
            return
        for send in self.plan.sends:
            self.sim.at(send.at_s, send.label, self._send(send.payload, send.shape))

    def _send(self, payload: dict[str, Any], shape: str = "") -> Callable[[], None]:
        """flip-api's send as a Python caller makes it: the broker carries it through kombu's
        json (never refused nor dropped: a message lost on the way would leave nothing to
        count); in the `shape` a caller's `send_task` by name may give it."""
        broker = self.sim.broker
        kwargs: dict[str, Any] = {"payload": payload}
        args: tuple[Any, ...] = ()
        if shape == FIELDS:
            kwargs = dict(payload)
        elif shape == POSITIONAL:
            kwargs, args = {}, (payload,)
        elif shape == EXTRA:
            args = (payload["caller_key"],)

        def send() -> None:
            push = broker.push
            push(names.ENQUEUE_JOB, kwargs, origin="flip-api", faulty=False, args=args)

        return send

    def check(self) -> None:
        """`request-kept`: every enqueue sent a job or a recorded refusal, each distinct
        refused payload recorded once."""
        plan, sim = self.plan, self.sim
        if plan is None:
            return
        conn = sim.conn
        # The gone-bundle band removes the job folder for a while (tests.sim.gone_bundle): a
        # request that came meanwhile is refused for the folder, rightly (racy 8445:
        # the corrected request 0.3 s into the gap), one distinct refusal more.
        folder_gone = self._gone is not None and self._gone.job is not None
        for key, sent in plan.distinct.items():
            rows = conn.execute(
                "SELECT reason_code, reason FROM rejected_requests WHERE caller_key = ?"
                " ORDER BY id",
                (key,),
            ).fetchall()
            gap = sum(1 for _, why in rows if folder_gone and "not a folder under the job" in why)
            distinct = sent + gap
            (jobs,) = conn.execute(
                "SELECT count(*) FROM jobs WHERE caller_key = ?", (key,)
            ).fetchone()
            if not rows and not jobs:
                sim.report(
                    "request-kept",
                    f"caller_key {key}",
                    "flip-api's enqueue left neither a job nor a refusal under its key (lost)",
                )
            elif key in plan.jobs and not jobs and not gap:
                sim.report(
                    "request-kept",
                    f"caller_key {key} job",
                    "flip-api's corrected request (its one payload kwarg) left no job",
                )
            elif len(rows) != distinct and not jobs:
                sim.report(
                    "request-kept",
                    f"caller_key {key} refusals",
                    f"{distinct} distinct refused payloads sent, {len(rows)} refusals "
                    f"recorded {[str(r[0]) for r in rows]}",
                )
            if sim.world.callbacks:
                got = sum(1 for k in sim.receiver.rejected_keys.values() if k == key)
                if got > distinct:
                    sim.report("request-kept", f"caller_key {key} events", f"{got} rejected events")

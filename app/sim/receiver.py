"""flip-api's callback endpoint as the simulation sees it: a `CallbackSender` whose receiver
is down for a while, answers 5xx or 4xx, times out, or refuses one job's payloads for good,
and that keeps the TRUE record of what it accepted, so the invariants can check delivery
(every event delivered or visibly undeliverable, in order per job, correctly signed)
instead of trusting the dispatcher's own counters.

Every post first calls `host.hook("callback.post", None)`: time passes there (a timeout
costs CALLBACK_TIMEOUT_S), the worker may die, another worker may run a message.

A receiver may also hang on some jobs' events (and some refused enqueues') only, as
flip-api's handler does on a locked row, or fail on them (500 or 503 on a row it cannot
read, 429 or 408 from a proxy in front of it): every post of such a key times out, or is
answered that status at once, from its first one until the faults stop (half the keys), or
for a few seconds only (the others: a short outage of that handler), while every other event
is answered. The promise under test (tasks/README.md "Status callbacks": a handler that hangs
or fails on one event holds back no other job) is then checked at each acceptance: an event of
a job that never hung is accepted within a bound of its move, and one of a job whose hang
ended within that bound and a backoff of the later of its move and the end
(`callback-held-back`, `_held_back_bound`: a sweep's interval, a receiver's rest, the first
try of each key that hung meanwhile, and a round's timeouts if a key timed out meanwhile),
the time the broker was down not counted.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from app.adapters.callbacks import (
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Answer,
    ReceiverUnreachable,
    verify,
)
from app.sim.clock import EPOCH_S
from app.sim.faults import FaultProfile
from app.sim.host import Host
from app.sim.workload import WorldSpec

# What `callback-held-back` allows beyond a sweep's interval, a receiver's rest and four
# timeouts (if a hung key timed out meanwhile): the order of the simulation's messages
# behind the worker slots.
HELD_BACK_MARGIN_S = 20.0
HELD_BACK_TIMEOUTS = 4
# How a hung key fails, drawn once per key on its own stream: half time out, half are
# answered a "not now" at once (after FAIL_FAST_S).
HANG_ANSWERS: tuple[str | int, ...] = ("timeout",) * 4 + (500, 503, 429, 408)
FAIL_FAST_S = 0.05
# How long, drawn next on the same stream: until the faults stop, or (the other half) for a
# few seconds from the key's first post: it fails once or a few times, then is answered.
HANG_FOR_EVER_P = 0.5
SHORT_HANG_S = (0.5, 10.0)
SECRET = "sim-callback-secret-0123456789"  # noqa: S105 (a simulated receiver's, not a credential)
URL = "http://flip-api.sim/fl/callbacks"


@dataclass
class Outage:
    """From `start` to `end` the receiver answers every post with `answer`: "down" (no
    answer: refused or timed out), or an HTTP status."""

    start: float
    end: float
    answer: str | int


@dataclass
class SimReceiver:
    """The receiver's behaviour over time and what it accepted."""

    host: Host
    rng: random.Random
    timeout_s: float
    outages: list[Outage] = field(default_factory=list)
    refused_jobs: dict[str, int] = field(default_factory=dict)  # job id -> 4xx it answers
    accepted: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    accepted_rejections: set[str] = field(default_factory=set)
    rejected_keys: dict[str, str | None] = field(default_factory=dict)  # event id -> its key
    posts: int = 0
    quiet: bool = False  # faults have stopped: outages end, only refusals of a job remain
    # Hangs per job (see the module doc): off unless `hang()` is called.
    hang_p: float = 0.0
    hang_stream: str = ""
    hung: dict[str, float] = field(default_factory=dict)  # job id / event id -> first post
    hung_answer: dict[str, str | int] = field(default_factory=dict)  # ... -> "timeout", status
    hung_until: dict[str, float] = field(default_factory=dict)  # ... -> its end (inf: none)
    # `callback-held-back` (see `_held_back_bound`), on once `hang()` is called: a sweep's
    # interval, a rest and the margin; and the longest rest.
    held_back_bound_s: float | None = None
    rest_s: float = 0.0

    def hang(self, stream: str, p: float, world: WorldSpec) -> None:
        """Hang on a share `p` of the jobs and refused enqueues (each drawn on `stream` by
        its own id, so no other draw moves, with how: a timeout, or a 500, 503, 429 or 408
        at once; and how long: until the faults stop, or a few seconds), and check that no
        other event waits for them longer than a receiver's rest, a sweep's interval and
        their tries allow (`_held_back_bound`)."""
        self.hang_p = p
        self.hang_stream = stream
        self.held_back_bound_s = (
            world.housekeeping_interval_s + world.callback_max_backoff_s + HELD_BACK_MARGIN_S
        )
        self.rest_s = world.callback_max_backoff_s

    def _hang_answer(self, key: str | None) -> str | int | None:
        """How the receiver fails on `key` now ("timeout" or a status), None: it does not."""
        if key is None or not self.hang_p or self.quiet:
            return None
        t = self.host.clock.t
        if key in self.hung:
            return self.hung_answer[key] if t < self.hung_until[key] else None
        draws = random.Random(f"{self.hang_stream}/{key}")
        if draws.random() >= self.hang_p:
            return None
        self.hung[key] = t
        self.hung_answer[key] = draws.choice(HANG_ANSWERS)
        for_ever = draws.random() < HANG_FOR_EVER_P
        self.hung_until[key] = math.inf if for_ever else t + draws.uniform(*SHORT_HANG_S)
        return self.hung_answer[key]

    def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        host = self.host
        host.hook("callback.post", None)
        self.posts += 1
        t = host.clock.t
        answer = self._answer(t, body)
        if isinstance(answer, _Hung):
            if answer.status is None:
                host.clock.advance(self.timeout_s)
                raise ReceiverUnreachable("ReadTimeout: timed out (simulated hang on this event)")
            host.clock.advance(FAIL_FAST_S)  # no draw of `rng`: every other post's as before
            return Answer(answer.status, f"simulated {answer.status} on this event")
        if answer == "down":
            if self.rng.random() < 0.5:
                host.clock.advance(self.timeout_s)  # a read timeout: the whole budget spent
                raise ReceiverUnreachable("ReadTimeout: timed out (simulated)")
            raise ReceiverUnreachable("ConnectError: connection refused (simulated)")
        host.clock.advance(self.rng.uniform(0.01, 0.3))
        status = int(answer)
        if 200 <= status < 300:
            self._accept(body, headers)
        return Answer(status, "" if status < 300 else f"simulated {status}")

    def close(self) -> None:
        """Nothing to release."""

    def _answer(self, t: float, body: bytes) -> str | int | _Hung:
        job_id = _job_of(body)
        if job_id is not None and job_id in self.refused_jobs:
            return self.refused_jobs[job_id]
        hung = self._hang_answer(_hang_key(body))
        if hung is not None:
            return _Hung(None if hung == "timeout" else int(hung))
        if not self.quiet:
            for outage in self.outages:
                if outage.start <= t < outage.end:
                    return outage.answer
        return 200

    def _accept(self, body: bytes, headers: Mapping[str, str]) -> None:
        """Check what a receiver checks (tasks/README.md's snippet: signature over the raw body,
        timestamp near its clock), then note the event as delivered."""
        host = self.host
        event_id = headers.get(EVENT_ID_HEADER, "?")
        now_s = EPOCH_S + host.clock.t
        ok = verify(
            SECRET,
            headers.get(TIMESTAMP_HEADER, ""),
            headers.get(SIGNATURE_HEADER, ""),
            body,
            now_s=now_s,
        )
        try:
            payload = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            host.report("callback-well-formed", f"event {event_id}", f"body is not JSON: {exc}")
            return
        if not ok:
            host.report(
                "callback-well-formed", f"event {event_id}", "signature or timestamp refused"
            )
        if str(payload.get("event_id")) != event_id:
            host.report(
                "callback-well-formed",
                f"event {event_id}",
                f"header names event {event_id}, body {payload.get('event_id')}",
            )
        self._check_held_back(payload)
        if payload.get("kind") == "rejected":
            self.accepted_rejections.add(str(payload.get("event_id")))
            self.rejected_keys[str(payload.get("event_id"))] = payload.get("caller_key")
            return
        job_id = str(payload.get("job_id"))
        seen = self.accepted[job_id]
        if seen and int(payload["event_id"]) < seen[-1]:
            host.report(
                "callback-order",
                f"job {job_id[:8]}",
                f"event {payload['event_id']} delivered after event {seen[-1]}",
            )
        seen.append(int(payload["event_id"]))

    def _check_held_back(self, payload: dict[str, object]) -> None:
        """`callback-held-back`: while the receiver hangs on other events only, an event it
        answers was not kept waiting past the bound."""
        now = self.host.clock.t
        if not any(start < now for start in self.hung.values()):
            return
        key = _key_of(payload)
        if key is None or self.hung_until.get(key, 0.0) == math.inf:
            return
        try:
            at = datetime.fromisoformat(str(payload["at"])).timestamp() - EPOCH_S
        except (KeyError, ValueError):
            return  # callback-well-formed's to report
        # A job whose hang ended: from then on (its own backoff first, in the bound).
        since = max(at, self.hung_until.get(key, at))
        waited = now - since - _overlap(self.host.broker.outages, since, now)
        bound, new = self._held_back_bound(since, now)
        if key in self.hung:
            bound += self.rest_s
        if waited > bound:
            hung = sorted(self._hung_label(k) for k in self.hung)
            more = f" and {len(hung) - 6} more" if len(hung) > 6 else ""
            end = " (or its own hang's end)" if key in self.hung else ""
            self.host.report(
                "callback-held-back",
                f"event {payload.get('event_id')}",
                f"accepted {waited:.0f}s after its move{end}, the broker's outages not counted "
                f"(bound {bound:.0f}s, {new} hung first tried meanwhile) while the receiver "
                f"hung on {', '.join(hung[:6])}{more}",
            )

    def _hung_label(self, key: str) -> str:
        """A hung key, how it fails, and for how long if not for ever."""
        until = self.hung_until[key]
        span = "" if until == math.inf else f" for {until - self.hung[key]:.0f}s"
        return f"{_short(key)} ({self.hung_answer[key]}{span})"

    def _held_back_bound(self, at: float, now: float) -> tuple[float, int]:
        """How long an event that moved at `at` may wait for acceptance at `now`: a sweep's
        interval, a rest and the margin; four timeouts (a round under way may try several
        keys that time out) if a key timed out meanwhile; and for each key first tried
        meanwhile (never tried, it goes in id order among the events not tried: nobody can
        know it fails before trying) its try, and a rest for every second one (two failures
        in a row). Returns the bound and how many keys were first tried meanwhile."""
        assert self.held_back_bound_s is not None
        bound = self.held_back_bound_s
        if any(
            answer == "timeout" and self.hung[k] <= now and self.hung_until[k] >= at
            for k, answer in self.hung_answer.items()
        ):
            bound += HELD_BACK_TIMEOUTS * self.timeout_s
        new = [k for k, start in self.hung.items() if at <= start <= now]
        tries_s = sum(
            self.timeout_s if self.hung_answer[k] == "timeout" else FAIL_FAST_S for k in new
        )
        return bound + tries_s + (len(new) + 1) // 2 * self.rest_s, len(new)


@dataclass(frozen=True)
class _Hung:
    """The answer to a hung key's post: a timeout (`status` None), or that status at once."""

    status: int | None


def _overlap(windows: list[tuple[float, float]], since: float, until: float) -> float:
    """How much of `since`-`until` the windows cover (overlapping ones counted once)."""
    covered, reach = 0.0, since
    for began, ended in sorted(windows):
        start, end = max(began, reach), min(ended, until)
        if end > start:
            covered += end - start
            reach = end
    return covered


def _short(key: str) -> str:
    """A hung key as a violation names it: a job id's first 8, a refusal's event id."""
    return key if key.startswith("rejected") else key[:8]


def _key_of(payload: dict[str, object]) -> str | None:
    """What a hang is drawn for: the job of a state change, the event of a refusal."""
    if payload.get("kind") == "rejected":
        return str(payload.get("event_id"))
    job = payload.get("job_id")
    return str(job) if job is not None else None


def _hang_key(body: bytes) -> str | None:
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return _key_of(payload) if isinstance(payload, dict) else None


def _job_of(body: bytes) -> str | None:
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    job = payload.get("job_id") if isinstance(payload, dict) else None
    return str(job) if job is not None else None


def random_receiver(
    host: Host, seed: int, profile: FaultProfile, world: WorldSpec, horizon_s: float
) -> SimReceiver:
    """A receiver for a seed: clean, or with outages (down, 5xx, 429, 408) within the
    workload's horizon (a faulty profile's, or a world that starts in one); hanging on some
    jobs if the profile says so."""
    rng = random.Random(f"{seed}/receiver")
    faulty = (not profile.clean and profile.receiver_outages) or world.receiver_failures_before > 0
    receiver = SimReceiver(host, rng, timeout_s=rng.choice((1.0, 5.0)))
    if profile.receiver_hang_p:
        receiver.hang(f"{seed}/receiver-hang", profile.receiver_hang_p, world)
    if faulty:
        for _ in range(rng.randint(1, 3)):
            start = rng.uniform(0.0, horizon_s)
            receiver.outages.append(
                Outage(
                    start,
                    start + rng.uniform(5.0, 120.0),
                    rng.choice(("down", "down", 500, 503, 429, 408, 400)),
                )
            )
    return receiver

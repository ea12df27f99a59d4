"""flip-api's callback endpoint as the simulation sees it: a `CallbackSender` whose receiver
is down for a while, answers 5xx or 4xx, times out, or refuses one job's payloads for good,
and that keeps the TRUE record of what it accepted, so the invariants can check delivery
(every event delivered or visibly undeliverable, in order per job, correctly signed)
instead of trusting the dispatcher's own counters.

Every post first calls `host.hook("callback.post", None)`: time passes there (a timeout
costs CALLBACK_TIMEOUT_S), the worker may die, another worker may run a message.

A receiver may also hang on some jobs' events (and some refused enqueues') only, as
flip-api's handler does on a locked row: every post of such a job times out from its first
one until the faults stop, while every other event is answered. The promise under test
(tasks/README.md "Status callbacks": a handler that hangs on one event holds back no other job) is
then checked at each acceptance: an event of a job that never hung is accepted within
`held_back_bound_s` of its move (`callback-held-back`).
"""

from __future__ import annotations

import json
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
# timeouts: the order of the simulation's messages behind the worker slots.
HELD_BACK_MARGIN_S = 20.0
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
    held_back_bound_s: float | None = None

    def hang(self, stream: str, p: float, world: WorldSpec) -> None:
        """Hang on a share `p` of the jobs and refused enqueues (each drawn on `stream` by
        its own id, so no other draw moves), and check that no other event waits for them
        longer than a receiver's rest, a sweep's interval and a few timeouts allow."""
        self.hang_p = p
        self.hang_stream = stream
        self.held_back_bound_s = (
            world.housekeeping_interval_s
            + world.callback_max_backoff_s
            + 4 * self.timeout_s
            + HELD_BACK_MARGIN_S
        )

    def _hangs_on(self, key: str | None) -> bool:
        if key is None or not self.hang_p or self.quiet:
            return False
        if key in self.hung:
            return True
        if random.Random(f"{self.hang_stream}/{key}").random() >= self.hang_p:
            return False
        self.hung[key] = self.host.clock.t
        return True

    def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        host = self.host
        host.hook("callback.post", None)
        self.posts += 1
        t = host.clock.t
        answer = self._answer(t, body)
        if answer == "hang":
            host.clock.advance(self.timeout_s)
            raise ReceiverUnreachable("ReadTimeout: timed out (simulated hang on this event)")
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

    def _answer(self, t: float, body: bytes) -> str | int:
        job_id = _job_of(body)
        if job_id is not None and job_id in self.refused_jobs:
            return self.refused_jobs[job_id]
        if self._hangs_on(_hang_key(body)):
            return "hang"
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
        if self.held_back_bound_s is None or not self.hung:
            return
        key = _key_of(payload)
        if key is None or key in self.hung:
            return
        try:
            at = datetime.fromisoformat(str(payload["at"])).timestamp() - EPOCH_S
        except (KeyError, ValueError):
            return  # callback-well-formed's to report
        waited = self.host.clock.t - at
        if waited > self.held_back_bound_s and any(
            start < self.host.clock.t for start in self.hung.values()
        ):
            hung = ", ".join(sorted(k[:8] for k in self.hung))
            self.host.report(
                "callback-held-back",
                f"event {payload.get('event_id')}",
                f"accepted {waited:.0f}s after its move (bound {self.held_back_bound_s:.0f}s) "
                f"while the receiver hung on {hung} only",
            )


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

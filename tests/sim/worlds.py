"""A seed's random world and workload (the bug-hunting sweep's): 2 to 4 nets, some
always-on, and jobs with hostile payloads, aborts and reports at random moments or armed for
a job's state (app.sim.workload's specs)."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

from app.sim.workload import SITES, CallerEvent, JobSpec, NetSpec, Workload, WorldSpec


def random_world(rng: random.Random) -> WorldSpec:
    """2 to 4 nets, scale-to-zero, sometimes one always-on."""
    count = rng.randint(2, 4)
    nets = []
    for i in range(count):
        static = i == count - 1 and rng.random() < 0.35
        nets.append(
            NetSpec(
                name=f"net-{chr(ord('a') + i)}",
                kind="static" if static else "ecs",
                idle_timeout_s=float(rng.choice((20, 30, 45))),
                ready_timeout_s=float(rng.choice((40, 50, 60))),
                keeps_jobs=rng.random() < 0.6,
            )
        )
    return WorldSpec(nets=tuple(nets), lost_job_policy=rng.choice(("requeue", "requeue", "fail")))


METADATA_MAX_BYTES = 16 * 1024  # app.schemas.METADATA_MAX_BYTES
# Valid but hostile text: a lone surrogate (JSON can carry it escaped, UTF-8 cannot), NUL,
# bidi overrides, combining marks, a BOM, astral characters, a non-character.
HOSTILE_TEXT = ("\ud800", "\udfff", "\x00", "\u202e", "e\u0301", "\ufeff", "\U0001f600", "\uffff")


def _sized(fill: str, size: int) -> dict[str, Any]:
    """Metadata whose compact JSON (as the schema measures it) is exactly `size` bytes."""
    base = len(json.dumps({"pad": ""}, separators=(",", ":")).encode())
    unit = len(json.dumps(fill).encode()) - 2
    count, rest = divmod(size - base, unit)
    return {"pad": fill * count + "x" * rest}


def hostile_metadata(rng: random.Random) -> dict[str, Any] | None:
    """What flip-api may put in a job's metadata: nothing, the usual ids, unicode edge
    cases, or a size at the limit, one byte under or one over it."""
    kind = rng.choice(("none", "ids", "unicode", "unicode", "size", "deep"))
    if kind == "none":
        return None
    if kind == "ids":
        return {"model_id": f"m-{rng.randint(1, 9)}", "project_id": "p-1"}
    if kind == "unicode":
        text = "".join(rng.choice(HOSTILE_TEXT) for _ in range(rng.randint(1, 4)))
        return {"name": text, text: [text, {"k": text}]}
    if kind == "deep":
        nested: Any = "leaf"
        for _ in range(rng.randint(20, 60)):
            nested = [nested]
        return {"nested": nested, "resource_spec": {"site-1": {"num_of_gpus": 0}}}
    fill = rng.choice(("a", "\u00e9", "\U0001f600"))
    return _sized(fill, METADATA_MAX_BYTES + rng.choice((-1, 0, 1)))


def hostile_text(rng: random.Random, limit: int) -> str:
    """A report's detail or an abort's reason: empty, unicode edge cases, or exactly at
    its length limit."""
    kind = rng.choice(("empty", "unicode", "limit"))
    if kind == "empty":
        return ""
    if kind == "unicode":
        return "".join(rng.choice(HOSTILE_TEXT) for _ in range(rng.randint(1, 6)))
    return "".join(rng.choice(("d", "\u00e9", "\U0001f600")) for _ in range(limit))


REPORTED_STATUSES = ("results_uploaded", "results_upload_failed", "error", "stopped")
# The states a caller's event may wait for: every state a job can be in while flip-api
# still watches it (a report or an abort may come at any moment, whatever the job does).
EVENT_STATES = ("QUEUED", "ASSIGNED", "DISPATCHING", "RUNNING", "FINISHING", "ABORTING")


def random_workload(
    rng: random.Random, world: WorldSpec, *, abort_p: float, report_p: float
) -> Workload:
    """3 to 7 jobs arriving over the first two minutes, some aborted or reported on; faults
    stop at 170 s."""
    horizon = 170.0
    jobs = []
    events = []
    names = [n.name for n in world.nets]
    # Its own stream, so the jobs and the first events of a seed are drawn as before.
    caller = random.Random(rng.random())
    for i in range(rng.randint(3, 7)):
        arrive = round(rng.uniform(0, 120), 1)
        key = f"job-{i}"
        sites = SITES if rng.random() > 0.08 else (*SITES, "site-9")  # site-9 never connects
        jobs.append(
            JobSpec(
                key=key,
                arrive_s=arrive,
                duration_s=round(rng.uniform(15, 100), 1),
                net=rng.choice(names) if rng.random() < 0.3 else None,
                sites=sites,
                priority=rng.choice((0, 0, 0, 5)),
            )
        )
        if caller.random() < 0.3:
            jobs[-1] = dataclasses.replace(jobs[-1], definition="s3://sim-bundles/jobs/fedavg")
        if caller.random() < 0.35:
            # Hostile but valid (or just past a limit): a caller key of the longest length,
            # metadata at every edge, the most attempts, the lowest priority.
            jobs[-1] = JobSpec(
                key=f"{key}-" + "k" * (199 - len(key)),
                arrive_s=arrive,
                duration_s=jobs[-1].duration_s,
                net=jobs[-1].net,
                sites=jobs[-1].sites,
                priority=caller.choice((-1000, 0, 1000)),
                metadata=hostile_metadata(caller),
                # 100 attempts of a job whose site never connects would take hours of
                # simulated time: the limit is drawn for jobs that can run.
                max_attempts=caller.choice(
                    (None, 1) if "site-9" in jobs[-1].sites else (None, 1, 100)
                ),
                definition=jobs[-1].definition,
            )
            key = jobs[-1].key
        aborted = False
        if rng.random() < abort_p:
            aborted = True
            at = round(arrive + rng.uniform(0, 150), 1)
            trigger = rng.choice((None, None, "DISPATCHING", "ASSIGNED", "RUNNING"))
            if trigger is None and caller.random() < 0.3:
                trigger = caller.choice(EVENT_STATES)
            text = hostile_text(caller, 500) if caller.random() < 0.3 else ""
            events.append(
                CallerEvent(at if trigger is None else arrive, key, "abort", "", trigger, text)
            )
        if aborted and caller.random() < 0.3:
            # flip-api says a job stopped while its abort is still under way (ABORTING).
            status = caller.choice(REPORTED_STATUSES)
            text = hostile_text(caller, 2000) if caller.random() < 0.3 else ""
            events.append(CallerEvent(arrive, key, "report", status, "ABORTING", text))
        if rng.random() < report_p:
            status = rng.choice(("results_uploaded", "error", "stopped"))
            at = round(arrive + rng.uniform(5, 200), 1)
            trigger = rng.choice((None, None, "DISPATCHING", "RUNNING"))
            if caller.random() < 0.4:
                status = caller.choice(REPORTED_STATUSES)
                trigger = caller.choice((None, *EVENT_STATES))
            if trigger == "ABORTING" and not aborted:
                # A report that races an abort: flip-api stops a job, then says it stopped.
                events.append(CallerEvent(arrive, key, "abort", "", "RUNNING"))
            text = hostile_text(caller, 2000) if caller.random() < 0.3 else ""
            events.append(
                CallerEvent(at if trigger is None else arrive, key, "report", status, trigger, text)
            )
    events.sort(key=lambda e: (e.at_s, e.key, e.kind))
    return Workload(jobs=tuple(jobs), events=tuple(events), horizon_s=horizon)

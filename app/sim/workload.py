"""What a simulation runs: the nets (a `WorldSpec`) and the jobs with their timing (a
`Workload`). A seed draws both at random; a later `fl-dispatcher simulate TRACE` builds them
from a trace file instead and hands them to the same `Simulation`."""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from typing import Any

SITES = ("site-1", "site-2")
COMPLETED = "FINISHED:COMPLETED"


@dataclass(frozen=True)
class ColdStart:
    """How long a net's server takes to come up and to go away (simulated seconds, fixed
    figures): the scale-to-zero replay's model of a cold start, instead of the seeded random
    delays the bug-hunting sweep draws."""

    name: str
    provision_s: float  # scale-up asked -> the server process starts (task placement, image pull)
    login_s: float  # process started -> a fresh admin login works
    sites_s: float  # login-ready -> every site has re-registered
    stop_s: float = 1.0  # scale-down asked -> the process is gone

    @property
    def total_s(self) -> float:
        """Scale-up asked to server ready for a job (what one cold start adds to a wait)."""
        return self.provision_s + self.login_s + self.sites_s


@dataclass(frozen=True)
class NetSpec:
    """One net: scale-to-zero (`ecs`, driven by our fake driver) or always-on (`static`)."""

    name: str
    kind: str = "ecs"  # "ecs" | "static"
    idle_timeout_s: float = 30.0
    ready_timeout_s: float = 50.0
    sites: tuple[str, ...] = SITES
    # The server's job store survives a restart (NVFLARE 2.9 then reports a killed run as
    # RUNNING forever) or is lost with the process (the run is forgotten).
    keeps_jobs: bool = True
    # Fixed start-up and stop delays; None: the sweep's seeded random ones.
    cold_start: ColdStart | None = None
    # NETS declares the net's sites (a job needing another is refused at enqueue).
    declares_sites: bool = False


@dataclass(frozen=True)
class JobSpec:
    """A job arriving at `arrive_s`; each run of it lasts `duration_s` (None: hangs)."""

    key: str
    arrive_s: float
    duration_s: float | None = 60.0
    outcome: str = COMPLETED
    net: str | None = None
    sites: tuple[str, ...] = SITES
    priority: int = 0
    definition: str = "job"  # a folder under JOB_ROOT, or app.sim.bundles.S3_DEFINITION
    # flip-api's own JSON object, sent as is (None: none sent).
    metadata: dict[str, Any] | None = None
    max_attempts: int | None = None
    # The caller_key of the prewarm sent for it (EnqueueJob.prewarm_key; None: not sent).
    prewarm_key: str | None = None


@dataclass(frozen=True)
class CallerEvent:
    """flip-api acting on a job at `at_s`: an abort, or a terminal-status report."""

    at_s: float
    key: str
    kind: str  # "abort" | "report"
    status: str = ""  # report: any ReportedStatus value (results_uploaded, error, ...)
    # Set: the event waits (from at_s on) until the job is in this state, and is sent at
    # that very moment, possibly while a worker is in the middle of a step of that job.
    on_state: str | None = None
    text: str = ""  # a report's detail, an abort's reason ("": the caller's default)


@dataclass(frozen=True)
class PrewarmSpec:
    """flip-api's prewarm hint at `at_s` (app.usecases.prewarm): a job for `net` (or, with
    no net, for `sites`) is likely within `within_s` seconds."""

    at_s: float
    key: str
    within_s: float
    net: str | None = None
    sites: tuple[str, ...] = ()
    # The random sweep's extras (app.sim.prewarms): a cancel of the key instead of a hint,
    # and a hint that waits (from at_s on, until the horizon) for `net` to be in this state.
    cancel: bool = False
    on_state: str | None = None


@dataclass(frozen=True)
class BurstSpec:
    """Two jobs of `jobs` sent together, from `at_s` on, the moment two READY nets are free
    and unheld (app.sim.bursts): `plain` (more urgent, names no hint) then `hinted`, which
    names the hint `key` sent just before them for one of those nets (`pick` chooses it)."""

    at_s: float
    plain: str
    hinted: str
    key: str
    within_s: float
    pick: float


@dataclass(frozen=True)
class WorldSpec:
    """The deployment: nets and the dispatcher's timing settings (simulated seconds)."""

    nets: tuple[NetSpec, ...]
    # Nets the platform runs that NETS declares only once a redeploy adds them.
    spare: tuple[NetSpec, ...] = ()
    per_job_fl_server: bool = True
    housekeeping_interval_s: float = 15.0
    keep_alive_interval_s: float = 60.0
    queued_poll_s: float = 1.0
    ready_poll_s: float = 4.0
    retry_max: int = 4
    retry_backoff_max_s: int = 8
    stuck_after_s: float = 40.0
    server_lost_grace_s: float = 25.0
    max_run_s: float = 150.0
    abort_timeout_s: float = 60.0
    max_attempts: int = 3
    lost_job_policy: str = "requeue"
    # "reported": a finished run holds its server (FINISHING) until flip-api reports the
    # upload, or REPORT_TIMEOUT_S passes.
    release_after: str = "finished"
    report_timeout_s: float = 60.0
    # Job status pushed to flip-api's callback endpoint (app.usecases.callbacks).
    callbacks: bool = False
    callback_max_backoff_s: float = 8.0
    # The receiver had already failed this many tries in a row when the world starts (a
    # receiver down for days: thousands of tries at CALLBACK_MAX_BACKOFF_S apart).
    receiver_failures_before: int = 0
    # PREWARM_MAX_S (the settings' default unless a prewarm world draws a short one).
    prewarm_max_s: float = 900.0

    def retry_budget_s(self) -> float:
        """The longest a pipeline step keeps retrying a transient error (sum of caps)."""
        return float(sum(min(self.retry_backoff_max_s, 2 * 2**k) for k in range(self.retry_max)))


@dataclass(frozen=True)
class Workload:
    """Jobs and caller events; faults stop and the world drains after `horizon_s`."""

    jobs: tuple[JobSpec, ...]
    events: tuple[CallerEvent, ...] = ()
    horizon_s: float = 170.0
    prewarms: tuple[PrewarmSpec, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)
    bursts: tuple[BurstSpec, ...] = ()  # jobs sent by app.sim.bursts, not at arrive_s


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

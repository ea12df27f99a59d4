"""What a simulation runs: the nets (a `WorldSpec`) and the jobs with their timing (a
`Workload`). `fl-dispatcher simulate TRACE` builds them from a trace file (app.sim.savings);
the bug-hunting sweep draws them at random per seed (tests/sim/worlds.py)."""

from __future__ import annotations

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
    """One net: scale-to-zero (`ecs`, driven by our fake driver) or always-on (`static`),
    whose server is an NVFLARE server or a Flower SuperLink (`backend`)."""

    name: str
    kind: str = "ecs"  # "ecs" | "static"
    idle_timeout_s: float = 30.0
    ready_timeout_s: float = 50.0
    sites: tuple[str, ...] = SITES
    # The server's job store survives a restart (NVFLARE 2.9 then reports a killed run as
    # RUNNING forever; a Flower SuperLink with --database reads it running until its task
    # expires, then finished:failed) or is lost with the process (the run is forgotten).
    keeps_jobs: bool = True
    # Fixed start-up and stop delays; None: the sweep's seeded random ones.
    cold_start: ColdStart | None = None
    # NETS declares the net's sites (a job needing another is refused at enqueue).
    declares_sites: bool = False
    # The net's backend (app.net_config's `backend`): which fake server the platform runs
    # (app.sim.servers, app.sim.superlink) and which fake client the workers build for it
    # (app.sim.admin, app.sim.flower_admin).
    backend: str = "nvflare"  # "nvflare" | "flower"


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
    # Its FLIP project (issue 40, fair share), sent as `project_id`, or in its metadata as
    # FLIP does today (`project_in_metadata`); None: the default project.
    project: str | None = None
    project_in_metadata: bool = False


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
    # The random sweep's extras (tests.sim.prewarms): a cancel of the key instead of a hint,
    # and a hint that waits (from at_s on, until the horizon) for `net` to be in this state.
    cancel: bool = False
    on_state: str | None = None


@dataclass(frozen=True)
class BurstSpec:
    """Two jobs of `jobs` sent together, from `at_s` on, the moment two READY nets are free
    and unheld (tests.sim.bursts): `plain` (more urgent, names no hint) then `hinted`, which
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
    awaited_poll_s: float = 1.0
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
    callback_events_per_read: int = 200  # CALLBACK_EVENTS_PER_READ
    # The receiver had already failed this many tries in a row when the world starts (a
    # receiver down for days: thousands of tries at CALLBACK_MAX_BACKOFF_S apart).
    receiver_failures_before: int = 0
    # PREWARM_MAX_S (the settings' default unless a prewarm world draws a short one).
    prewarm_max_s: float = 900.0
    # PROJECT_SHARES (JSON; "": the default, every project weighs 1 without a cap) and
    # AGING_S (None: the default, 6 h) of a world whose jobs belong to projects.
    project_shares: str = ""
    aging_s: float | None = None

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
    bursts: tuple[BurstSpec, ...] = ()  # jobs sent by tests.sim.bursts, not at arrive_s

"""The simulated outside world: each net's NVFLARE server, its scale driver, and the admin
clients a worker process builds for it.

Richer than tests/fakes.py: operations take simulated time, fail the way the real adapters
classify failures (app.errors), may act and then lose the reply, and servers restart (a new
start time; their runs forgotten, or kept "RUNNING" forever as NVFLARE 2.9 does after a
SIGKILL). The cluster keeps the TRUE set of runs (live or finished) of every net, so the
invariants can count real runs instead of trusting what the dispatcher believes.

Every adapter call first calls `host.hook(...)`: that is where the simulation spends the
call's latency, kills the worker, or lets another worker run a message in between.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from app.adapters.drivers.base import Observation
from app.adapters.nvflare.base import (
    AbortOutcome,
    AbortResult,
    Readiness,
    RunState,
    RunStatus,
    ServerState,
)
from app.errors import (
    AdminMisconfigured,
    DriverMisconfigured,
    DriverTransientError,
    NvflareJobNotFound,
    NvflareJobNotRunning,
    ServerUnavailable,
    TransientError,
    UnknownAdminError,
)
from app.sim.clock import EPOCH_S, SimClock
from app.sim.faults import FaultProfile
from app.sim.workload import COMPLETED, JobSpec, NetSpec

ABORTED = "FINISHED:ABORTED"
# NVFLARE 2.9 statuses in the dispatcher's words (app.adapters.nvflare.classify's mapping).
RUN_STATES = {
    COMPLETED: RunState.COMPLETED,
    ABORTED: RunState.ABORTED,
    "FINISHED:EXECUTION_EXCEPTION": RunState.FAILED,
    "FINISHED:FAILED_TO_RUN": RunState.FAILED,
    "FINISHED:CAN_NOT_SCHEDULE": RunState.FAILED,
    "FINISHED:ABNORMAL": RunState.LOST,
    "FINISHED:ABANDONED": RunState.LOST,
}
JOB_ID_LEN = 36  # a UUID in its canonical text form, as submit tokens start with it


class Host(Protocol):
    """What the fakes need from the simulation that owns them."""

    clock: SimClock
    rng: random.Random  # the fault stream

    @property
    def faults(self) -> FaultProfile: ...

    def hook(self, point: str, net: str | None) -> None: ...

    def on_submit(self, net: str, token: str, folder: Path) -> None: ...

    def on_scale(self, net: str, replicas: int) -> None: ...

    def job_spec(self, job_id: str) -> JobSpec | None: ...


@dataclass
class Run:
    """One NVFLARE run as it really is (not as any client believes)."""

    net: str
    nvflare_id: str
    token: str
    job_id: str
    attempt: int | None
    incarnation: int
    submitted_at: float
    end_at: float | None  # None: hangs (reports RUNNING forever)
    outcome: str  # its final status if it ends by itself
    poisoned: bool  # job_status never answers for it
    waiting: bool = False  # SUBMITTED for good: a required site never connects
    aborted_at: float | None = None
    killed_at: float | None = None  # its server process died under it

    def live(self, t: float) -> bool:
        """The run's processes are running (it occupies the server, it may produce results)."""
        if self.aborted_at is not None or self.killed_at is not None:
            return False
        return self.end_at is None or t < self.end_at

    def completed(self, t: float) -> bool:
        """It ran to FINISHED:COMPLETED (its results count)."""
        return (
            self.aborted_at is None
            and self.killed_at is None
            and self.end_at is not None
            and self.end_at <= t
            and self.outcome == COMPLETED
        )

    def status(self, t: float) -> str:
        """The raw NVFLARE status the server reports."""
        if self.aborted_at is not None:
            return ABORTED
        if self.killed_at is not None:
            return "RUNNING"  # NVFLARE 2.9 after a SIGKILL: the dead run reads RUNNING forever
        if self.end_at is not None and self.end_at <= t:
            return self.outcome
        return "SUBMITTED" if self.waiting else "RUNNING"


def parse_token(token: str) -> tuple[str, int | None]:
    """(job id, attempt) of a submit token `<job id>-<attempt>`."""
    job_id, _, rest = (
        token[:JOB_ID_LEN],
        token[JOB_ID_LEN : JOB_ID_LEN + 1],
        token[JOB_ID_LEN + 1 :],
    )
    try:
        return job_id, int(rest)
    except ValueError:
        return job_id, None


@dataclass
class SimServer:
    """One net's NVFLARE server process (its admin port, its sites, its job store)."""

    spec: NetSpec
    up_at: float | None = None  # the process's start time; None while it is down
    incarnation: int = 0
    boot_s: float = 1.0
    site_delays: tuple[float, ...] = ()
    store: dict[str, Run] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    partition_until: float = -1.0
    partitions: list[tuple[float, float]] = field(default_factory=list)
    kit_broken: bool = False
    no_start_time_until: float = -1.0
    # Windows in which every submit reaches the server but its reply is lost (a proxy that
    # times out answers): a dispatch's every retry, the last included, and reconcile's
    # re-sent submits with the same token all lose theirs.
    reply_loss: list[tuple[float, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self, t: float, rng: random.Random, no_start_time_p: float = 0.0) -> None:
        self.incarnation += 1
        self.up_at = t
        cold = self.spec.cold_start
        if cold is not None:
            self.boot_s = cold.login_s
            self.site_delays = tuple(cold.sites_s for _ in self.spec.sites)
        else:
            self.boot_s = rng.uniform(0.5, 4.0)
            self.site_delays = tuple(rng.uniform(0.5, 8.0) for _ in self.spec.sites)
        if no_start_time_p and rng.random() < no_start_time_p:
            self.no_start_time_until = t + self.boot_s + rng.uniform(5.0, 40.0)
        if not self.spec.keeps_jobs:
            self.store.clear()
            self.tokens.clear()

    def stop(self, t: float, runs: list[Run]) -> None:
        """The process dies: every live run on it dies too (zombies stay in the store)."""
        if self.up_at is None:
            return
        for run in runs:
            if run.net == self.name and run.live(t):
                run.killed_at = t
        self.up_at = None
        if not self.spec.keeps_jobs:
            self.store.clear()
            self.tokens.clear()

    def partition(self, start: float, end: float) -> None:
        """The admin port is unreachable from `start` to `end` (the server runs on)."""
        self.partition_until = max(self.partition_until, end)
        self.partitions.append((start, end))

    def partitioned_at(self, t: float) -> bool:
        return any(start <= t < end for start, end in self.partitions)

    def answering(self, t: float) -> bool:
        return (
            self.up_at is not None and t >= self.up_at + self.boot_s and t >= self.partition_until
        )

    def reachable(self, t: float) -> bool:
        """The dispatcher's admin client can talk to it (up, not partitioned, kit fine)."""
        return self.answering(t) and not self.kit_broken

    def booting(self, t: float) -> bool:
        return self.up_at is not None and t < self.up_at + self.boot_s

    def sites(self, t: float) -> tuple[str, ...]:
        if self.up_at is None:
            return ()
        ready_at = self.up_at + self.boot_s
        return tuple(
            s for s, d in zip(self.spec.sites, self.site_delays, strict=True) if t >= ready_at + d
        )

    def site_connects_at(self, site: str) -> float | None:
        """When `site` is (or was) connected to this incarnation; None: never."""
        if self.up_at is None or site not in self.spec.sites:
            return None
        return self.up_at + self.boot_s + self.site_delays[self.spec.sites.index(site)]

    def start_time(self) -> float:
        assert self.up_at is not None
        return EPOCH_S + self.up_at


class Cluster:
    """Every net's server and driver, the true record of runs, and timed world changes."""

    def __init__(self, host: Host, nets: Sequence[NetSpec], rng: random.Random) -> None:
        self.host = host
        self.rng = rng  # the world stream (delays, durations)
        self.servers = {n.name: SimServer(n) for n in nets}
        self.drivers = {n.name: SimDriver(self, n) for n in nets}
        self.runs: list[Run] = []
        self._timers: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        for net in nets:
            if net.kind == "static":  # always on: up before the simulation starts
                self.drivers[net.name].pin_up(-100.0)

    def at(self, t: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._timers, (t, next(self._seq), action))

    def next_change(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def advance(self, t: float) -> None:
        """Apply every timed change due by `t`, in time order, at its own time."""
        while self._timers and self._timers[0][0] <= t:
            when, _, action = heapq.heappop(self._timers)
            action(when)

    # --- the true state, for invariants -------------------------------------------------

    def live_runs(self, t: float) -> list[Run]:
        return [r for r in self.runs if r.live(t)]

    def replicas(self, net: str) -> int:
        """What the platform really runs or is about to run for the net."""
        d = self.drivers[net]
        return max(d.desired, 1 if d.running else 0, 1 if d.start_at is not None else 0)

    # --- server-side effects --------------------------------------------------------------

    def submit(self, server: SimServer, token: str, t: float) -> Run:
        known = server.tokens.get(token)
        if known is not None and known in server.store:
            return server.store[known]  # NVFLARE's submit token: the same job, no second run
        job_id, attempt = parse_token(token)
        spec = self.host.job_spec(job_id)
        faults = self.host.faults
        duration = spec.duration_s if spec is not None else 60.0
        outcome = spec.outcome if spec is not None else COMPLETED
        rng = self.host.rng
        if duration is not None and rng.random() < faults.hung_run:
            duration = None
        if rng.random() < faults.failed_run:
            outcome = rng.choice(("FINISHED:EXECUTION_EXCEPTION", "FINISHED:ABNORMAL"))
        # NVFLARE keeps a job SUBMITTED until its sites are connected; one that names a site
        # this server never sees waits forever.
        start = t
        waits_forever = False
        for site in spec.sites if spec is not None else ():
            connects = server.site_connects_at(site)
            if connects is None:
                waits_forever = True
            else:
                start = max(start, connects)
        if waits_forever:
            duration = None
        run = Run(
            net=server.name,
            nvflare_id=f"nv-{server.name}-{next(self._ids)}",
            token=token,
            job_id=job_id,
            attempt=attempt,
            incarnation=server.incarnation,
            submitted_at=t,
            end_at=None if duration is None else start + duration,
            outcome=outcome,
            waiting=waits_forever,
            poisoned=rng.random() < faults.poisoned_status,
        )
        self.runs.append(run)
        server.store[run.nvflare_id] = run
        server.tokens[token] = run.nvflare_id
        return run

    def crash(self, net: str, t: float, down_s: float) -> None:
        """The server process is killed; the platform brings a new one up `down_s` later."""
        server = self.servers[net]
        if server.up_at is None:
            return
        server.stop(t, self.runs)
        self.drivers[net].replica_died(t, down_s)


class SimDriver:
    """A scale driver whose replica starts and stops after a delay, and that can fail."""

    kind = "sim"

    def __init__(self, cluster: Cluster, spec: NetSpec) -> None:
        self.cluster = cluster
        self.spec = spec
        self.name = spec.name
        self.desired = 0
        self.running = False
        self.start_at: float | None = None
        self.stop_at: float | None = None
        self.failure: str | None = None
        self.broken = False
        self.pinned = False  # a static (always-on) server: scale changes nothing
        self._gen = 0
        self.calls: list[int] = []
        # (t, replicas) at every change of what the platform runs for the net (server-hours),
        # and when each start from zero was asked for (cold starts).
        self.timeline: list[tuple[float, int]] = []
        self.cold_starts: list[float] = []

    @property
    def server(self) -> SimServer:
        return self.cluster.servers[self.name]

    def pin_up(self, t: float) -> None:
        self.pinned = True
        self.desired = 1
        self.running = True
        self.server.start(t, self.cluster.rng, self.cluster.host.faults.no_start_time_at_boot)
        self._note(t)

    # --- the ScaleDriver protocol ---------------------------------------------------------

    def scale(self, replicas: int) -> None:
        host = self.cluster.host
        host.hook("driver.scale", self.name)
        self._faults()
        self.calls.append(replicas)
        if self.pinned:
            return
        host.on_scale(self.name, replicas)
        self.apply(replicas, host.clock.t)
        host.hook("driver.scale.after", self.name)
        if host.rng.random() < host.faults.driver_lost_reply:
            raise DriverTransientError(f"{self.name}: UpdateService timed out (it was applied)")

    def observe(self) -> Observation:
        self.cluster.host.hook("driver.observe", self.name)
        self._faults()
        return Observation(
            desired=self.desired,
            running=1 if self.running else 0,
            pending=1 if self.start_at is not None else 0,
            failure=self.failure,
        )

    def _faults(self) -> None:
        host = self.cluster.host
        self.cluster.advance(host.clock.t)
        if self.broken:
            raise DriverMisconfigured(f"{self.name}: service not found (simulated)")
        if host.rng.random() < host.faults.driver_transient:
            raise DriverTransientError(f"{self.name}: throttled (simulated)")

    # --- the platform ------------------------------------------------------------------------

    def apply(self, replicas: int, t: float) -> None:
        """What the platform does with a desired count (also used by an operator's deploy)."""
        if replicas >= 1:
            self.desired = 1
            if self.stop_at is not None:  # still running: keep it
                self.stop_at = None
                self._gen += 1
            if not self.running and self.start_at is None and self.failure is None:
                host = self.cluster.host
                if host.rng.random() < host.faults.driver_failure:
                    self.failure = "tasks failed to start (circuit breaker, simulated)"
                    return
                cold = self.spec.cold_start
                if cold is not None:
                    self.cold_starts.append(t)
                    self._schedule_up(t + cold.provision_s)
                else:
                    slow = host.faults.driver_slow
                    self._schedule_up(t + self.cluster.rng.uniform(2.0, 40.0 if slow else 10.0))
        else:
            self.desired = 0
            self.failure = None
            if self.start_at is not None:
                self.start_at = None
                self._gen += 1
            if self.running and self.stop_at is None:
                cold = self.spec.cold_start
                if cold is not None:
                    self.stop_at = t + cold.stop_s
                else:
                    slow = self.cluster.host.faults.driver_slow
                    self.stop_at = t + self.cluster.rng.uniform(0.0, 20.0 if slow else 4.0)
                gen = self._gen
                self.cluster.at(self.stop_at, lambda when: self._down(when, gen))
        self._note(t)

    def _note(self, t: float) -> None:
        replicas = self.cluster.replicas(self.name)
        if not self.timeline or self.timeline[-1][1] != replicas:
            self.timeline.append((t, replicas))

    def _schedule_up(self, at: float) -> None:
        self._gen += 1
        gen = self._gen
        self.start_at = at
        self.cluster.at(at, lambda when: self._up(when, gen))

    def _up(self, t: float, gen: int) -> None:
        if gen != self._gen:
            return
        self.start_at = None
        self.running = True
        self.server.start(t, self.cluster.rng, self.cluster.host.faults.no_start_time_at_boot)
        self._note(t)

    def _down(self, t: float, gen: int) -> None:
        if gen != self._gen:
            return
        self.stop_at = None
        self.running = False
        self.server.stop(t, self.cluster.runs)
        self._note(t)

    def replica_died(self, t: float, down_s: float) -> None:
        """The process was killed; the platform replaces it if it is still wanted."""
        if self.pinned:
            self._gen += 1
            gen = self._gen
            self.cluster.at(t + down_s, lambda when: self._restart_pinned(when, gen))
            return
        self.running = False
        self.stop_at = None
        if self.desired >= 1:
            self._schedule_up(t + down_s)
        self._note(t)

    def _restart_pinned(self, t: float, gen: int) -> None:
        if gen == self._gen:
            self.server.start(t, self.cluster.rng, self.cluster.host.faults.no_start_time_at_boot)


class SimAdmin:
    """One worker process's admin client of a net: the real client's contract (which errors
    escape which call) on top of a SimServer, with injected faults."""

    def __init__(self, cluster: Cluster, net: str) -> None:
        self.cluster = cluster
        self.net = net
        self._connected = False
        self.closed = 0

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def server(self) -> SimServer:
        return self.cluster.servers[self.net]

    def _reach(self, op: str) -> SimServer:
        host = self.cluster.host
        host.hook(f"admin.{op}", self.net)
        t = host.clock.t
        self.cluster.advance(t)
        server = self.server
        if server.kit_broken:
            self._connected = False
            raise AdminMisconfigured(f"{self.net}: admin kit rejected (simulated)")
        if not server.answering(t):
            self._connected = False
            raise ServerUnavailable(f"{self.net}: server not answering (simulated)")
        faults = host.faults
        roll = host.rng.random()
        if roll < faults.admin_unavailable:
            self._connected = False
            raise ServerUnavailable(f"{self.net}: connection reset (simulated)")
        if roll < faults.admin_unavailable + faults.admin_unknown:
            raise UnknownAdminError(f"{self.net}: unclassified nvflare error (simulated)")
        self._connected = True
        return server

    def _no_start_time(self, server: SimServer) -> bool:
        host = self.cluster.host
        t = host.clock.t
        return t < server.no_start_time_until or host.rng.random() < host.faults.no_start_time

    def server_state(self) -> ServerState:
        try:
            self._reach("server_state")
        except AdminMisconfigured:
            raise
        except TransientError:
            t = self.cluster.host.clock.t
            return ServerState.STARTING if self.server.booting(t) else ServerState.UNREACHABLE
        return ServerState.STARTED

    def server_start_time(self) -> float:
        server = self._reach("server_start_time")
        if self._no_start_time(server):
            raise UnknownAdminError(f"{self.net}: server reported no start time")
        return server.start_time()

    def connected_sites(self) -> list[str]:
        server = self._reach("connected_sites")
        return sorted(server.sites(self.cluster.host.clock.t))

    def is_ready(self, required_sites: Sequence[str]) -> Readiness:
        try:
            server = self._reach("is_ready")
        except AdminMisconfigured:
            raise
        except TransientError as exc:
            t = self.cluster.host.clock.t
            state = ServerState.STARTING if self.server.booting(t) else ServerState.UNREACHABLE
            return Readiness(False, state, detail=str(exc))
        sites = tuple(sorted(server.sites(self.cluster.host.clock.t)))
        missing = tuple(s for s in required_sites if s not in sites)
        start = None if self._no_start_time(server) else server.start_time()
        return Readiness(
            ready=not missing,
            server_state=ServerState.STARTED,
            connected_sites=sites,
            missing_sites=missing,
            detail=f"waiting for sites: {', '.join(missing)}" if missing else "",
            server_start_time=start,
        )

    def submit(self, job_folder: Path, submit_token: str) -> str:
        host = self.cluster.host
        server = self._reach("submit")
        host.on_submit(self.net, submit_token, job_folder)
        run = self.cluster.submit(server, submit_token, host.clock.t)
        host.hook("admin.submit.after", self.net)
        self._lose_reply("submit")
        return run.nvflare_id

    def _lose_reply(self, op: str) -> None:
        host = self.cluster.host
        faults = host.faults
        if op == "submit" and any(a <= host.clock.t < b for a, b in self.server.reply_loss):
            self._connected = False
            raise ServerUnavailable(f"{self.net}: submit sent, reply timed out (simulated)")
        if host.rng.random() < faults.lost_reply:
            if host.rng.random() < faults.lost_reply_partition:
                now = host.clock.t
                self.server.partition(now, now + host.rng.uniform(10.0, faults.partition_max_s))
            self._connected = False
            raise ServerUnavailable(f"{self.net}: {op} sent, reply lost (simulated)")

    def _raw_status(self, nvflare_job_id: str) -> str:
        server = self._reach("job_status")
        run = server.store.get(nvflare_job_id)
        if run is None:
            raise NvflareJobNotFound(f"{self.net}: no job {nvflare_job_id}")
        if run.poisoned:
            raise UnknownAdminError(f"{self.net}: job {nvflare_job_id} has no status")
        return run.status(self.cluster.host.clock.t)

    def job_status(self, nvflare_job_id: str) -> RunStatus:
        """The run's state in the dispatcher's words (as app.adapters.nvflare.classify maps)."""
        raw = self._raw_status(nvflare_job_id)
        state = RUN_STATES.get(raw)
        if state is None:
            state = RunState.LOST if raw.startswith("FINISHED") else RunState.RUNNING
        return RunStatus(state, f"NVFLARE {raw}")

    def find_run(self, submit_token: str) -> str | None:
        """The run submitted with this token, if the server (still) knows one."""
        server = self._reach("find_run")
        run_id = server.tokens.get(submit_token)
        return run_id if run_id is not None and run_id in server.store else None

    def abort(self, nvflare_job_id: str) -> AbortResult:
        """As the real client: status first, then abort; down/unknown is NOTHING_TO_ABORT, a
        run no process holds NOT_RUNNING; UnknownAdminError and AdminMisconfigured escape."""
        try:
            try:
                status = self._raw_status(nvflare_job_id)
            except UnknownAdminError:
                status = ""  # as the real client: the abort is sent anyway
            if status.startswith("FINISHED"):
                return AbortResult(AbortOutcome.ALREADY_FINISHED, status)
            server = self._reach("abort")
            run = server.store.get(nvflare_job_id)
            if run is None:
                raise NvflareJobNotFound(f"{self.net}: no job {nvflare_job_id}")
            t = self.cluster.host.clock.t
            if not run.live(t):
                raise NvflareJobNotRunning(f"{self.net}: job {nvflare_job_id} not running")
            run.aborted_at = t
            self.cluster.host.hook("admin.abort.after", self.net)
            self._lose_reply("abort")
        except ServerUnavailable as exc:
            return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"server unavailable: {exc}")
        except NvflareJobNotFound as exc:
            return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"unknown job: {exc}")
        except NvflareJobNotRunning as exc:
            try:
                status = self._raw_status(nvflare_job_id)
            except (TransientError, NvflareJobNotFound):
                status = ""
            if status.startswith("FINISHED"):
                return AbortResult(AbortOutcome.ALREADY_FINISHED, status)
            return AbortResult(AbortOutcome.NOT_RUNNING, f"job not running: {exc}")
        return AbortResult(AbortOutcome.ABORTED, "aborted")

    def ping(self) -> None:
        self._reach("ping")

    def close(self) -> None:
        self.closed += 1
        self._connected = False

"""The simulated platform: every net's server and scale driver, the TRUE set of runs (live
or finished) of every net, so the invariants can count real runs instead of trusting what
the dispatcher believes, and the timed changes of the world (a replica up, a replica down).

Every driver call first calls `host.hook(...)`: that is where the simulation spends the
call's latency, kills the worker, or lets another worker run a message in between.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence

from app.adapters.drivers.base import Observation
from app.errors import DriverMisconfigured, DriverTransientError
from app.sim.host import Host
from app.sim.servers import Run, SimServer, parse_token
from app.sim.superlink import FLOWER, SuperLink
from app.sim.workload import COMPLETED, NetSpec


class Cluster:
    """Every net's server and driver, the true record of runs, and timed world changes."""

    def __init__(
        self,
        host: Host,
        nets: Sequence[NetSpec],
        rng: random.Random,
        *,
        crash_rng: random.Random | None = None,
        deaf_rng: random.Random | None = None,
        start_rng: random.Random | None = None,
        flower_rng: random.Random | None = None,
    ) -> None:
        self.host = host
        self.rng = rng  # the world stream (delays, durations)
        # crashes just before a submit: a stream of their own, drawn only where the profile
        # has them, so the other streams (and every other profile's seeds) stay as they were
        self.crash_rng = crash_rng or random.Random(0)
        self.deaf_rng = deaf_rng or random.Random(0)  # runs whose abort does not take
        self.start_rng = start_rng or random.Random(0)  # runs the job runner starts slowly
        # Flower SuperLinks' draws (app.sim.superlink): only worlds with a Flower net use it.
        self.flower_rng = flower_rng or random.Random(0)
        self.servers: dict[str, SimServer] = {
            n.name: SuperLink(n, flower_rng=self.flower_rng)
            if n.backend == FLOWER
            else SimServer(n)
            for n in nets
        }
        self.drivers = {n.name: SimDriver(self, n) for n in nets}
        self.runs: list[Run] = []
        self._timers: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        for net in nets:
            if net.kind == "static":  # always on: up before the simulation starts
                self.drivers[net.name].pin_up(-100.0)

    def _server(self, spec: NetSpec) -> SimServer:
        """The net's server process: an NVFLARE server, or a Flower SuperLink."""
        if spec.backend == FLOWER:
            return SuperLink(spec, flower_rng=self.flower_rng)
        return SimServer(spec)

    def unsee_reads(self, message_id: int) -> None:
        """The handler's reads of a run's end so far saw nothing: a database error failed
        what it went on to write."""
        for server in self.servers.values():
            server.finished_read.pop(message_id, None)

    def reads_done(self, message_id: int, *, seen: bool) -> None:
        """The handler's delivery ended: its reads of a run's end left standing were seen
        (`seen`: it returned or raised) or not (its worker died under it)."""
        for server in self.servers.values():
            ends = server.finished_read.pop(message_id, set())
            if seen:
                server.finished_seen |= ends

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
        if isinstance(server, SuperLink):  # no submit token: every start-run is a new run
            run = server.new_run(self.host, token, t, next(self._ids))
            self.runs.append(run)
            return run
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
        starts_at = None
        if faults.slow_start and self.start_rng.random() < faults.slow_start and not waits_forever:
            starts_at = t + self.start_rng.uniform(2.0, 20.0)
            start = max(start, starts_at)
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
            starts_at=starts_at,
            poisoned=rng.random() < faults.poisoned_status,
        )
        run.deaf = bool(faults.deaf_run) and self.deaf_rng.random() < faults.deaf_run
        self.runs.append(run)
        server.store[run.nvflare_id] = run
        server.tokens[token] = run.nvflare_id
        return run

    def crash_before_submit(self, net: str, t: float) -> None:
        """Per the profile, kill the server a submit is about to reach (back 1-5 s later)."""
        p = self.host.faults.crash_before_submit
        if not p:
            return
        self.advance(t)
        if self.servers[net].up_at is not None and self.crash_rng.random() < p:
            self.crash(net, t, self.crash_rng.uniform(1.0, 5.0))

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
        # The last desired count was set by hand to 0 (tests.sim.adversary's drift), not by
        # the dispatcher nor an operator's deploy: what a human fix undoes (app.sim.operator).
        self.by_hand = False
        self.refused_at: float | None = None  # the last call the platform throttled
        # When each call the platform took asked for a replica of none (a start asked for).
        self.asks: list[float] = []
        # When each call for a replica of none reached the platform, whatever its answer.
        self.tries: list[float] = []
        # A platform outage (tests.sim.platform_faults): from start to end every call (or,
        # `scale_only`, every scale call) is refused, not the random throttle of `refused_at`.
        self.refusing: tuple[float, float] | None = None
        self.scale_only = False
        # An access denial (tests.sim.late_starts' DENY: an IAM change still propagating):
        # from start to end every call is refused as misconfigured (DriverMisconfigured).
        self.denying: tuple[float, float] | None = None
        # A replica that exits at start (a docker container crashing at boot reads as desired
        # 0: app/adapters/drivers/docker.py); `lost_at`: the last one the platform lost so.
        self.exits_at_start = False
        self.lost_at: float | None = None
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
        self.calls.append(replicas)  # every call tried, whether the platform answers or not
        if replicas >= 1 and not self.desired:
            self.tries.append(host.clock.t)
        self._faults(scale=True)
        if self.pinned:
            return
        host.on_scale(self.name, replicas)
        if replicas >= 1 and not self.desired:
            self.asks.append(host.clock.t)
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

    def refuses(self, t: float, *, scale: bool = True) -> bool:
        """The platform's outage refuses this call at `t` (every call, or scale calls)."""
        window = self.refusing
        return window is not None and window[0] <= t < window[1] and (scale or not self.scale_only)

    def takes_no_scale(self, t: float) -> bool:
        """Every scale call is refused at `t`: a broken driver, an access denial or the
        platform's outage (the dispatcher can take no server down meanwhile)."""
        denied = self.denying is not None and self.denying[0] <= t < self.denying[1]
        return self.broken or denied or self.refuses(t)

    def _faults(self, *, scale: bool = False) -> None:
        host = self.cluster.host
        self.cluster.advance(host.clock.t)
        if self.broken:
            raise DriverMisconfigured(f"{self.name}: service not found (simulated)")
        if self.denying is not None and self.denying[0] <= host.clock.t < self.denying[1]:
            raise DriverMisconfigured(f"{self.name}: AccessDeniedException (simulated IAM)")
        if self.refuses(host.clock.t, scale=scale):
            raise DriverTransientError(f"{self.name}: endpoint unreachable (simulated outage)")
        if host.rng.random() < host.faults.driver_transient:
            self.refused_at = host.clock.t
            raise DriverTransientError(f"{self.name}: throttled (simulated)")

    # --- the platform ------------------------------------------------------------------------

    def apply(self, replicas: int, t: float) -> None:
        """What the platform does with a desired count (also used by an operator's deploy)."""
        self.by_hand = False
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
        if self.exits_at_start:
            # The container exits at boot and reads as none wanted: nothing restarts it.
            self.desired = 0
            self.lost_at = t
            self._note(t)
            return
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

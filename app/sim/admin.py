"""The simulated admin client: what a worker process builds for a net, with the real
client's contract (which errors escape which call, classified as app.errors does) on top of
a SimServer, with injected faults: operations take simulated time, fail, and may act and
then lose the reply.

Every call first calls `host.hook(...)` (the cluster's host): where the simulation spends
the call's latency, kills the worker, or lets another worker run a message in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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
    NvflareJobNotFound,
    NvflareJobNotRunning,
    ServerUnavailable,
    TransientError,
    UnknownAdminError,
)
from app.sim.clock import EPOCH_S
from app.sim.cluster import Cluster
from app.sim.servers import ABORTED, SimServer
from app.sim.workload import COMPLETED

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
        self.cluster.crash_before_submit(self.net, host.clock.t)
        server = self._reach("submit")
        # A token the server already holds is answered with its run (nvflare's submit token):
        # nothing of this folder runs, so its contents are not this submit's to check.
        host.on_submit(self.net, submit_token, job_folder, repeat=submit_token in server.tokens)
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
        if op == "abort" and faults.garbled_reply and host.rng.random() < faults.garbled_reply:
            raise UnknownAdminError(f"{self.net}: {op} sent, reply garbled (simulated)")

    def _raw_status(self, nvflare_job_id: str) -> str:
        server = self._reach("job_status")
        run = server.store.get(nvflare_job_id)
        if run is None:
            raise NvflareJobNotFound(f"{self.net}: no job {nvflare_job_id}")
        if run.poisoned:
            raise UnknownAdminError(f"{self.net}: job {nvflare_job_id} has no status")
        status = run.status(self.cluster.host.clock.t)
        if status.startswith("FINISHED"):
            server.finished_seen.add(nvflare_job_id)
        return status

    def live_runs(self) -> frozenset[str]:
        """The runs this server process runs now (a SUBMITTED one waits, not listed)."""
        server = self._reach("live_runs")
        t = self.cluster.host.clock.t
        return frozenset(
            run.nvflare_id for run in server.store.values() if run.live(t) and not run.waiting
        )

    def job_status(self, nvflare_job_id: str) -> RunStatus:
        """The run's state in the dispatcher's words (as app.adapters.nvflare.classify maps)."""
        raw = self._raw_status(nvflare_job_id)
        t = self.cluster.host.clock.t
        state = RUN_STATES.get(raw)
        if state is None:
            state = RunState.LOST if raw.startswith("FINISHED") else RunState.RUNNING
        run = self.cluster.servers[self.net].store[nvflare_job_id]
        if raw != "RUNNING":
            # Aborted before the job runner started it: no start time in the job store.
            return RunStatus(state, f"NVFLARE {raw}", unstarted=run.aborted_unstarted(t))
        # The job store's start time: a simulated run starts as it is submitted.
        return RunStatus(state, f"NVFLARE {raw}", started_at=EPOCH_S + run.submitted_at)

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
            # A deaf run goes on only on a net that scales to zero (its server's going down
            # ends it); on an always-on net an operator would have to step in.
            before_start = run.starting(t) or run.waiting
            if run.starting(t):
                # NVFLARE 2.9: marked FINISHED:ABORTED, but the job runner, busy starting
                # it, overwrites that with RUNNING when it is done.
                run.aborted_at, run.revives_at = t, run.starts_at
            elif run.waiting or not (run.deaf and self.cluster.host.scales_to_zero(self.net)):
                # A SUBMITTED job is marked by the server alone: no process to be deaf.
                run.aborted_at, run.revives_at = t, None
            self.cluster.host.hook("admin.abort.after", self.net)
            self._lose_reply("abort")
            if before_start:  # the real client reads nvflare's "before running it" answer
                return AbortResult(AbortOutcome.ABORTED_BEFORE_START, "aborted before running")
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

"""The simulated admin client: what a worker process builds for a net, with the real
client's contract (which errors escape which call, classified as app.errors does) on top of
a SimServer, with injected faults: operations take simulated time, fail, and may act and
then lose the reply.

Every call first calls `host.hook(...)` (the cluster's host): where the simulation spends
the call's latency, kills the worker, or lets another worker run a message in between.

The contract's answers (`status_of`: a status read; `abort_answer`: an abort, whatever the
server did or the reply lost on the way) are the unit tier's fake admin's too
(tests/fakes.py): what a client makes of a server's answer is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.adapters.backend import (
    AbortOutcome,
    AbortResult,
    Readiness,
    RunStatus,
    ServerState,
)
from app.adapters.nvflare.classify import run_status
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
from app.sim.servers import SimServer


def status_of(raw: str, *, started_at: float | None, unstarted: bool) -> RunStatus:
    """A run's raw NVFLARE status as the client reads it (the product's classification): a
    RUNNING run with its job store's start time, one aborted before its job runner started
    it (FINISHED:ABORTED, no start time) `unstarted`."""
    status = run_status(raw)
    if raw == "RUNNING":
        return replace(status, started_at=started_at)
    return replace(status, unstarted=True) if unstarted else status


def abort_answer(read_status: Callable[[], str], send_abort: Callable[[], bool]) -> AbortResult:
    """An abort as the real client answers it (app.adapters.nvflare.client): the run's
    status first (one that cannot be read is aborted all the same); a finished run is
    ALREADY_FINISHED; then the abort (`send_abort`: True when the run had not started): a
    server that does not answer, or a reply lost after it acted, and an unknown run are
    NOTHING_TO_ABORT, a run no process holds NOT_RUNNING (ALREADY_FINISHED if it ended
    meanwhile); an unclassified answer (UnknownAdminError) escapes."""
    try:
        try:
            status = read_status()
        except UnknownAdminError:
            status = ""  # as the real client: the abort is sent anyway
        if status.startswith("FINISHED"):
            return AbortResult(AbortOutcome.ALREADY_FINISHED, status)
        if send_abort():  # the real client reads nvflare's "before running it" answer
            return AbortResult(AbortOutcome.ABORTED_BEFORE_START, "aborted before running")
    except ServerUnavailable as exc:
        return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"server unavailable: {exc}")
    except NvflareJobNotFound as exc:
        return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"unknown job: {exc}")
    except NvflareJobNotRunning as exc:
        try:
            status = read_status()
        except (TransientError, NvflareJobNotFound):
            status = ""
        if status.startswith("FINISHED"):
            return AbortResult(AbortOutcome.ALREADY_FINISHED, status)
        return AbortResult(AbortOutcome.NOT_RUNNING, f"job not running: {exc}")
    return AbortResult(AbortOutcome.ABORTED, "aborted")


class SimAdmin:
    """One worker process's admin client of a net: the real client's contract (which errors
    escape which call) on top of a SimServer, with injected faults."""

    UNCLASSIFIED = "unclassified nvflare error"  # an error no class of app.errors names
    SITES_WORD = "sites"  # what readiness waits for, in its words

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
        other = self.cluster.servers.get(server.kit_other or "")
        if (
            server.kit_elsewhere is not None
            and server.kit_answer == "another"
            and other is not None
        ):
            server = other  # another net's server, reached and answering as its own
        elif server.kit_elsewhere is not None:
            self._connected = False
            if server.kit_answer == "refused":  # another project's server, or a TLS refusal
                raise AdminMisconfigured(
                    f"{self.net}: {server.kit_elsewhere} is another server: the kit or its "
                    "certificate refused (simulated)"
                )
            raise ServerUnavailable(
                f"{self.net}: cannot connect to server {server.kit_elsewhere} (simulated)"
            )
        if server.kit_broken:
            self._connected = False
            raise AdminMisconfigured(f"{self.net}: admin kit rejected (simulated)")
        if not server.answering(t):
            self._connected = False
            self.server.refused_last = True
            raise ServerUnavailable(f"{self.net}: server not answering (simulated)")
        faults = host.faults
        roll = host.rng.random()
        if roll < faults.admin_unavailable:
            self._connected = False
            self.server.refused_last = True
            raise ServerUnavailable(f"{self.net}: connection reset (simulated)")
        if roll < faults.admin_unavailable + faults.admin_unknown:
            raise UnknownAdminError(f"{self.net}: {self.UNCLASSIFIED} (simulated)")
        self._connected = True
        self.server.refused_last = False
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
        return Readiness(
            ready=not missing,
            server_state=ServerState.STARTED,
            connected_sites=sites,
            missing_sites=missing,
            detail=f"waiting for {self.SITES_WORD}: {', '.join(missing)}" if missing else "",
            server_start_time=self._ready_start_time(server),
        )

    def _ready_start_time(self, server: SimServer) -> float | None:
        """The start time a readiness answer carries (None: the server gave none)."""
        return None if self._no_start_time(server) else server.start_time()

    def submit(
        self,
        job_folder: Path,
        submit_token: str,
        *,
        required_sites: Sequence[str] = (),
        resource_spec: Any = None,
    ) -> str:
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
            reader = self.cluster.host.reader()
            if reader is None:
                server.finished_seen.add(nvflare_job_id)
            else:
                server.finished_read.setdefault(reader, set()).add(nvflare_job_id)
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
        own = self.server  # or, through a kit that reaches another net's server, its run
        run = (
            own.store.get(nvflare_job_id)
            or self.cluster.servers[own.kit_other or ""].store[nvflare_job_id]
        )
        # The job store's start time: a simulated run starts as it is submitted; aborted
        # before the job runner started it: no start time.
        return status_of(
            raw, started_at=EPOCH_S + run.submitted_at, unstarted=run.aborted_unstarted(t)
        )

    def find_run(self, submit_token: str) -> str | None:
        """The run submitted with this token, if the server (still) knows one."""
        server = self._reach("find_run")
        run_id = server.tokens.get(submit_token)
        return run_id if run_id is not None and run_id in server.store else None

    def abort(self, nvflare_job_id: str) -> AbortResult:
        """As the real client (`abort_answer`): status first, then abort; down/unknown is
        NOTHING_TO_ABORT, a run no process holds NOT_RUNNING; UnknownAdminError and
        AdminMisconfigured escape."""
        return abort_answer(
            lambda: self._raw_status(nvflare_job_id), lambda: self._abort(nvflare_job_id)
        )

    def _abort(self, nvflare_job_id: str) -> bool:
        """The abort command on the server (True: the run had not started yet)."""
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
        return before_start

    def ping(self) -> None:
        self._reach("ping")

    def close(self) -> None:
        self.closed += 1
        self._connected = False

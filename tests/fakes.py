"""Fakes of the two adapters, for fast unit tests of use cases and tasks ONLY.

Everything about connecting, readiness, submit and abort is pinned against a real NVFLARE
server in tests/integration; these fakes only let the branching logic run in milliseconds.
A FakeServer is scripted (the test sets each run's raw status), where the simulator's
servers (app/sim) play runs out in time; what a client makes of a server's answers (a
status read, an abort, a reply lost after the server acted) is the simulator's admin
client's contract, the same code (app.sim.admin `status_of`, `abort_answer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.adapters.backend import AbortResult, Readiness, RunStatus, ServerState
from app.adapters.drivers.base import Observation
from app.adapters.nvflare.classify import NOT_STARTED
from app.errors import NvflareJobNotFound, NvflareJobNotRunning, ServerUnavailable
from app.sim.admin import abort_answer, status_of


@dataclass
class FakeDriver:
    """A platform that does what it is told at once (or raises what the test sets)."""

    kind: str = "fake"
    replicas: int = 0
    calls: list[int] = field(default_factory=list)
    fail_with: Exception | None = None
    failure: str | None = None

    def scale(self, replicas: int) -> None:
        self.calls.append(replicas)
        if self.fail_with is not None:
            raise self.fail_with
        self.replicas = replicas

    def observe(self) -> Observation:
        if self.fail_with is not None:
            raise self.fail_with
        return Observation(self.replicas, self.replicas, 0, self.failure)


@dataclass
class FakeServer:
    """One net's NVFLARE server as the test sets it; it is down while `driver` says 0."""

    driver: FakeDriver | None = None
    up: bool = True
    sites: list[str] = field(default_factory=lambda: ["site-1", "site-2"])
    start_time: float = 1000.0
    statuses: dict[str, str] = field(default_factory=dict)
    submitted: dict[str, str] = field(default_factory=dict)  # token -> nvflare id
    started: dict[str, float] = field(default_factory=dict)  # nvflare id -> its start_time
    folders: list[Path] = field(default_factory=list)  # the job folder of each submit
    # The job's sites and resource spec each submit was given (what a Flower run's config gets)
    submit_args: list[tuple[tuple[str, ...], Any]] = field(default_factory=list)
    submit_error: Exception | None = None
    aborted: list[str] = field(default_factory=list)
    # Runs killed with an earlier server process: NVFLARE 2.9 still reads them RUNNING and
    # refuses their abort ("Job ... is not running.").
    killed: set[str] = field(default_factory=set)
    # Runs aborted before they started: their FINISHED:ABORTED has no start time.
    unstarted: set[str] = field(default_factory=set)
    pings: int = 0
    # The next abort acts on the server, then its reply is this error instead (once): a
    # ServerUnavailable is a reply lost, an UnknownAdminError one garbled (app.sim.admin).
    abort_reply: Exception | None = None
    on_submit: Callable[[], object] | None = None  # runs while a submit is "on the wire"
    on_start_time: Callable[[], object] | None = None  # runs while that call is "on the wire"

    def alive(self) -> bool:
        return self.up and (self.driver is None or self.driver.replicas > 0)

    def restart(self, start_time: float | None = None) -> None:
        """The process is killed and started again: every run it ran dies with it, though
        its record still reads RUNNING (as nvflare 2.9's does)."""
        self.killed |= {run for run, status in self.statuses.items() if status == "RUNNING"}
        self.start_time = start_time if start_time is not None else self.start_time + 500


@dataclass
class FakeAdmin:
    """An admin client of a FakeServer; `closed` counts close() calls."""

    server: FakeServer
    closed: int = 0
    connected: bool = False

    def _require(self) -> FakeServer:
        if not self.server.alive():
            self.connected = False
            raise ServerUnavailable("fake server down")
        self.connected = True
        return self.server

    def server_state(self) -> ServerState:
        return ServerState.STARTED if self.server.alive() else ServerState.UNREACHABLE

    def server_start_time(self) -> float:
        server = self._require()
        if server.on_start_time is not None:
            hook, server.on_start_time = server.on_start_time, None
            hook()
        return server.start_time

    def connected_sites(self) -> list[str]:
        return list(self._require().sites)

    def is_ready(self, required_sites: Sequence[str]) -> Readiness:
        if not self.server.alive():
            return Readiness(False, ServerState.UNREACHABLE, detail="down")
        missing = tuple(s for s in required_sites if s not in self.server.sites)
        return Readiness(
            not missing,
            ServerState.STARTED,
            tuple(self.server.sites),
            missing,
            server_start_time=self.server.start_time,
        )

    def submit(
        self,
        job_folder: Path,
        submit_token: str,
        *,
        required_sites: Sequence[str] = (),
        resource_spec: Any = None,
    ) -> str:
        server = self._require()
        server.folders.append(job_folder)
        server.submit_args.append((tuple(required_sites), resource_spec))
        if server.submit_error is not None:
            raise server.submit_error
        if server.on_submit is not None:
            server.on_submit()
        if submit_token not in server.submitted:
            nvflare_id = f"nv-{len(server.submitted) + 1}"
            server.submitted[submit_token] = nvflare_id
            server.statuses[nvflare_id] = "RUNNING"
            server.started[nvflare_id] = server.start_time + 1.0  # scheduled once submitted
        return server.submitted[submit_token]

    def find_run(self, submit_token: str) -> str | None:
        return self._require().submitted.get(submit_token)

    def live_runs(self) -> frozenset[str]:
        server = self._require()
        return frozenset(
            run
            for run, status in server.statuses.items()
            if status == "RUNNING" and run not in server.killed
        )

    def _raw_status(self, nvflare_job_id: str) -> str:
        server = self._require()
        if nvflare_job_id not in server.statuses:
            raise NvflareJobNotFound(f"fake server does not know {nvflare_job_id}")
        return server.statuses[nvflare_job_id]

    def job_status(self, nvflare_job_id: str) -> RunStatus:
        raw = self._raw_status(nvflare_job_id)
        unstarted = raw == "FINISHED:ABORTED" and nvflare_job_id in self.server.unstarted
        started_at = self.server.started.get(nvflare_job_id)
        return status_of(raw, started_at=started_at, unstarted=unstarted)

    def abort(self, nvflare_job_id: str) -> AbortResult:
        return abort_answer(
            lambda: self._raw_status(nvflare_job_id), lambda: self._abort(nvflare_job_id)
        )

    def _abort(self, nvflare_job_id: str) -> bool:
        """nvflare's abort_job (True: the run had not started: "... before running it")."""
        server = self._require()
        status = server.statuses.get(nvflare_job_id)
        if status is None:
            raise NvflareJobNotFound(f"fake server does not know {nvflare_job_id}")
        if nvflare_job_id in server.killed:
            raise NvflareJobNotRunning(f"job {nvflare_job_id} is not running")
        server.aborted.append(nvflare_job_id)
        server.statuses[nvflare_job_id] = "FINISHED:ABORTED"
        before_start = status in NOT_STARTED
        if before_start:
            server.unstarted.add(nvflare_job_id)
        if server.abort_reply is not None:
            reply, server.abort_reply = server.abort_reply, None
            raise reply
        return before_start

    def ping(self) -> None:
        self._require().pings += 1

    def close(self) -> None:
        self.closed += 1
        self.connected = False


def fake_runtime(settings: Any, sessions: Any, clock: Callable[[], Any], outbox: Any) -> Any:
    """A runtime on `sessions` whose every net has a fresh FakeDriver and an answering
    FakeAdmin (integration tests of the SQL: nothing outside the database is under test)."""
    from app.runtime import Runtime

    return Runtime(
        settings=settings,
        engine=sessions.kw["bind"],
        sessions=sessions,
        clock=clock,
        driver_factory=lambda net, s: FakeDriver(),
        admin_factory=lambda net, s: FakeAdmin(FakeServer()),
        outbox=outbox,
    )

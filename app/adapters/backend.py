"""What the pipeline needs from a net's federated-learning server, whatever its backend.

The use cases import from here only (issue 38; tests/unit/test_backend_interface.py), never
from one backend's package. Two implementations satisfy it, checked by mypy where
`app.runtime._build_admin` returns either as this interface:

- NVFLARE: `app.adapters.nvflare.client.NvflareAdminClient` (admin sessions, 2.9);
- Flower: `app.adapters.flower.client.FlowerControlClient` (a SuperLink's Control API, 1.42).

Both answer in the same types (`ServerState`, `Readiness`, `RunStatus`, `AbortResult`) and
raise the same error classes of `app.errors`: `ServerUnavailable` (down or starting: retry),
`AdminMisconfigured` (fatal until a human fixes the net), `NvflareJobNotFound` (the server has
no such run), `NvflareJobNotRunning`, `InvalidRequest` (the job's app or its folder is wrong),
`UnknownAdminError` (nobody classified it: retried, logged, counted). A net's `backend`
(app.net_config) picks the implementation (`app.runtime._build_admin`). The NVFLARE-worded
names that remain (`nvflare_job_id`, `NvflareJobNotFound`, `AdminClient`) are the tables' and
the use cases' own, kept until a change free to touch them renames them.

Where the backends differ, behind the same words:

- `server_start_time`: NVFLARE's server process start time; Flower's SuperLink tells none, so
  its client answers a constant (`flower.client.NO_START_TIME`) and a restart under a run
  shows in the run's own record instead (forgotten, or finished without a verdict: LOST).
- `submit`'s token: NVFLARE resolves it itself; the Flower client puts it in the run config
  and looks for it before starting a run. The job's sites and resource spec: NVFLARE's in
  the prepared meta.json's deploy map, Flower's in the run config (`flower.fab.SITES_KEY`).
- `abort`: Flower's stop is final, so it never answers ABORTED_BEFORE_START or NOT_RUNNING.
- Sites: NVFLARE's client names; Flower's SuperNodes by their registered names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol


class ServerState(StrEnum):
    """What the client can say about a server without ever raising for "down"."""

    UNREACHABLE = "unreachable"  # no connection, login impossible (down or scaled to zero)
    STARTING = "starting"  # the port answers but login is not possible yet (cold start)
    STARTED = "started"  # the server answered a command on a logged-in session


class AbortOutcome(StrEnum):
    """The answers an abort can have; none of them is an error for the caller."""

    ABORTED = "aborted"
    ALREADY_FINISHED = "already_finished"
    NOTHING_TO_ABORT = "nothing_to_abort"  # server down, or job unknown
    # The server, answering, holds no live run of it: "Job ... is not running." comes only
    # for a run NVFLARE 2.9 has in no process of its own, such as one killed with an earlier
    # server process (whose record still reads RUNNING for ever). The run is over.
    NOT_RUNNING = "not_running"
    # The server marked a run it had not started yet (SUBMITTED or DISPATCHED) as aborted.
    # No proof the run is over: NVFLARE 2.9's job runner, if it was deploying or starting
    # that run at the moment, sets it RUNNING over the mark afterwards and runs it. Only a
    # status read once the runner is done (abort.RUN_START_WINDOW_S) settles it.
    ABORTED_BEFORE_START = "aborted_before_start"


class RunState(StrEnum):
    """A run's state in the dispatcher's own words; the adapter maps the server's."""

    RUNNING = "running"  # submitted, scheduled or running: it still occupies the server
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    LOST = "lost"  # ended without a verdict (e.g. abandoned): decided by LOST_JOB_POLICY


@dataclass(frozen=True)
class RunStatus:
    """A run's state and the server's own word for it (for reasons and logs)."""

    state: RunState
    detail: str = ""
    # When the server set the run RUNNING (epoch seconds, its job store's `start_time`), for
    # a run that reads RUNNING; None otherwise or when unknown. NVFLARE 2.9 keeps a run killed
    # with its server process RUNNING for ever: one that started before the process that
    # answers now died with an earlier one.
    started_at: float | None = None
    # FINISHED:ABORTED with no start time in the job store: aborted before the server's job
    # runner started it. Not over for sure: a runner that was starting it sets it RUNNING
    # over that mark (app.usecases.abort.RUN_START_WINDOW_S).
    unstarted: bool = False


@dataclass(frozen=True)
class AbortResult:
    """The outcome of an abort and why."""

    outcome: AbortOutcome
    detail: str = ""


@dataclass(frozen=True)
class Readiness:
    """Whether a net can take a job now, and if not, what is still missing."""

    ready: bool
    server_state: ServerState
    connected_sites: tuple[str, ...] = ()
    missing_sites: tuple[str, ...] = ()
    detail: str = ""
    server_start_time: float | None = field(default=None)


class BackendClient(Protocol):
    """One net's server connection (an NVFLARE admin session, a SuperLink's Control API):
    lazy, fresh on every (re)connect, always closable."""

    @property
    def connected(self) -> bool:
        """True only if the last command succeeded."""
        ...

    def server_state(self) -> ServerState:
        """Never raises for an unreachable server; raises AdminMisconfigured for a wrong kit."""
        ...

    def server_start_time(self) -> float:
        """The server's start time (epoch seconds); changes when the server restarts."""
        ...

    def connected_sites(self) -> list[str]:
        """Names of the client sites currently registered with the server."""
        ...

    def is_ready(self, required_sites: Sequence[str]) -> Readiness:
        """The server answers now (on the live session, or a fresh login if it has none or it
        failed), every required site connected; never raises for "not ready yet" (only
        AdminMisconfigured escapes)."""
        ...

    def submit(
        self,
        job_folder: Path,
        submit_token: str,
        *,
        required_sites: Sequence[str] = (),
        resource_spec: Any = None,
    ) -> str:
        """Submit a job folder; a repeated token returns the existing job's id. The job's
        sites and resource spec: NVFLARE's are in the prepared folder's meta.json already
        (jobdefs.prepare); Flower's go into the run config."""
        ...

    def find_run(self, submit_token: str) -> str | None:
        """The id of the run submitted with this token, or None if the server has none."""
        ...

    def job_status(self, nvflare_job_id: str) -> RunStatus:
        """The run's state; NvflareJobNotFound if the server does not know the run."""
        ...

    def live_runs(self) -> frozenset[str]:
        """The ids of the runs the server process runs now: a run killed with an earlier
        process is not among them, though its record reads RUNNING for ever."""
        ...

    def abort(self, nvflare_job_id: str) -> AbortResult:
        """Abort a job; a down server or unknown/not-running job is NOTHING_TO_ABORT."""
        ...

    def ping(self) -> None:
        """A cheap command that refreshes the session (keep-alive)."""
        ...

    def close(self) -> None:
        """Close and forget the session so the process can exit promptly."""
        ...


# The name the use cases knew it by (app.usecases.monitor); the same Protocol.
AdminClient = BackendClient

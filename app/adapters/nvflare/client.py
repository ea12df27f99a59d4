"""The NVFLARE admin side of one net (implements `base.AdminClient`) on nvflare 2.9.

Rules this module exists to keep (app/adapters/README.md,
"NVFLARE 2.9.0 behaviour this code relies on"):

- Connect lazily, and build a FRESH `Session` on every (re)connect. nvflare's
  `AdminAPI.connect` creates and starts its cell before authenticating and returns early when
  a cell exists, so a session whose first connect failed can never log in later
  ("poisoned"): it is closed and dropped, never retried with `try_connect`.
- `connected` means "the last command succeeded". Any connection-class error closes and drops
  the session; the next command starts from a fresh one.
- Every nvflare exception is mapped in ONE place, `classify.classify`, into the error classes of
  `app.errors`, with the raw nvflare exception as `__cause__`.
- A wrong kit is never tolerated as "server down": `kit_check` checks the kit and the
  certificate the server presents before any login, and a server whose port answers TLS with
  the right certificate but refuses our login past the net's readiness deadline is declared
  misconfigured.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from app.adapters.backend import (
    AbortOutcome,
    AbortResult,
    Readiness,
    RunStatus,
    ServerState,
)
from app.adapters.nvflare import kit_check
from app.adapters.nvflare.classify import aborted_before_start, classified_error, meta_status
from app.adapters.nvflare.sessions import close_quietly, install_fast_challenge_retry
from app.errors import (
    AdminMisconfigured,
    DispatcherError,
    InvalidRequest,
    NvflareJobNotFound,
    NvflareJobNotRunning,
    ServerUnavailable,
    TransientError,
    UnknownAdminError,
)
from app.net_config import NetConfig
from app.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

_PROBE_TIMEOUT_S = 2.0


def _is_connection_failure(error: DispatcherError) -> bool:
    # Anything but a job-level answer means the session can no longer be trusted.
    return not isinstance(error, (NvflareJobNotFound, NvflareJobNotRunning, InvalidRequest))


# Every client alive in this process, closed before the interpreter joins its threads: an
# nvflare session left open keeps its cell's executor threads running, and a process whose
# caller forgot close() never exits (measured: still alive after 120 s).
_live_clients: weakref.WeakSet[NvflareAdminClient] = weakref.WeakSet()


def _close_live_clients() -> None:
    for client in list(_live_clients):
        client.close()


# threading's own exit hook runs before non-daemon threads are joined (the plain atexit
# module runs after, too late); the concurrent.futures executors nvflare uses are joined by a
# hook registered earlier, and these hooks run in reverse order, so ours comes first.
_register_at_thread_exit = getattr(threading, "_register_atexit", None)
if _register_at_thread_exit is not None:
    import concurrent.futures.thread  # noqa: F401  (its exit hook must be registered first)

    _register_at_thread_exit(_close_live_clients)
else:  # pragma: no cover - CPython < 3.9
    atexit.register(_close_live_clients)


class NvflareAdminClient:
    """One net's admin connection (see the module docstring for the rules it keeps)."""

    def __init__(
        self,
        *,
        net_name: str,
        kit_dir: Path,
        username: str,
        login_timeout_s: float,
        command_timeout_s: float,
        login_max_tries: int,
        misconfigured_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.net_name = net_name
        self.kit_dir = kit_dir
        self.username = username
        self.login_timeout_s = login_timeout_s
        self.command_timeout_s = command_timeout_s
        self.login_max_tries = login_max_tries
        self.misconfigured_after_s = misconfigured_after_s
        self._clock = clock
        self._lock = threading.RLock()
        self._session: Any = None
        self._connected = False
        # Set while the server's port answers TLS with the right certificate but our login
        # keeps failing; past `misconfigured_after_s` that is a misconfiguration.
        self._login_refused_since: float | None = None
        self._last_probe: kit_check.ServerProbe | None = None
        self.sessions_created = 0
        _live_clients.add(self)

    # --- session management --------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True only if the last command succeeded."""
        return self._connected

    @property
    def session(self) -> Any:
        """The current nvflare session, or None (exposed so tests can see it was renewed)."""
        return self._session

    def close(self) -> None:
        """Close and forget the session so the process can exit promptly."""
        with self._lock:
            self._drop(logout=True)

    def __enter__(self) -> NvflareAdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drop(self, *, logout: bool) -> None:
        session, self._session = self._session, None
        self._connected = False
        if session is not None:
            close_quietly(session, logout=logout)

    def _context(self) -> str:
        return f"net {self.net_name!r} (admin kit {self.kit_dir})"

    def _connect(self) -> Any:
        """A fresh, logged-in session, or the classified reason why not."""
        kit = kit_check.check_kit_files(self.kit_dir)
        if kit.client_cn != self.username:
            # nvflare would only say "error:client_registration no registration session".
            raise AdminMisconfigured(
                f"{self._context()}: username {self.username!r} is not the kit's user "
                f"(its certificate is for {kit.client_cn!r})"
            )
        probe = kit_check.probe_server(kit, timeout=min(_PROBE_TIMEOUT_S, self.login_timeout_s))
        self._last_probe = probe
        if probe is kit_check.ServerProbe.REFUSED:
            # Nothing listens: down or scaled to zero. A login attempt could only time out.
            self._login_refused_since = None
            raise ServerUnavailable(f"{self._context()}: nothing listens on {kit.endpoint}")
        if probe is kit_check.ServerProbe.NOT_SERVING:
            no_tls = ServerUnavailable(
                f"{self._context()}: {kit.endpoint} accepts connections but does not serve"
            )
            self._note_refused_login(kit, no_tls)
            raise no_tls
        try:
            session = self._open_session()
        except Exception as exc:
            error = classified_error(exc, self._context())
            if isinstance(error, TransientError):
                self._note_refused_login(kit, exc)
            raise error from exc
        self._login_refused_since = None
        self.sessions_created += 1
        return session

    def _open_session(self) -> Any:
        """What `new_secure_session` does, minus its cleanup: on a failed connect it calls
        `close()`, which sends a logout and waits the whole command timeout for an answer
        from a server we never logged in to. A failed (poisoned) session is closed here
        without that round trip, and never used again."""
        from nvflare.fuel.flare_api.flare_api import Session

        install_fast_challenge_retry()
        session = Session(username=self.username, startup_path=str(self.kit_dir))
        try:
            session.api.auto_login_max_tries = self.login_max_tries
            session.set_timeout(self.command_timeout_s)
            session.try_connect(self.login_timeout_s)
        except BaseException:
            close_quietly(session, logout=False)
            raise
        return session

    def _note_refused_login(self, kit: kit_check.AdminKit, exc: BaseException) -> None:
        """Start or check the clock of "the port answers but we cannot log in"."""
        now = self._clock()
        if self._login_refused_since is None:
            self._login_refused_since = now
            return
        refused_for = now - self._login_refused_since
        if refused_for > self.misconfigured_after_s:
            raise AdminMisconfigured(
                f"{self._context()}: {kit.endpoint} has accepted connections for "
                f"{refused_for:.0f} s but never let this admin kit log in (last: "
                f"{type(exc).__name__}: {exc}); check the kit, its user and the net's server"
            ) from exc

    def _run(self, operation: Callable[[Any], T]) -> T:
        """Run one command on the session, connecting first if needed.

        A session that was reused and fails with a connection-class error is dropped and the
        command is tried once more on a fresh session: the server may have restarted (the
        old session only recovers 20-30 s later) or expired the session after 1800 s idle.
        Every operation used here is idempotent (submit is made so by its token).
        """
        with self._lock:
            for attempt in (1, 2):
                reused = self._session is not None
                try:
                    if self._session is None:
                        self._session = self._connect()
                    result = operation(self._session)
                except Exception as exc:
                    error = classified_error(exc, self._context())
                    if not _is_connection_failure(error):
                        self._connected = True  # the server answered
                        raise error from exc
                    self._drop(logout=False)
                    if reused and attempt == 1 and not isinstance(error, AdminMisconfigured):
                        log.info("%s: session failed (%s); retrying on a fresh one", self, error)
                        continue
                    raise error from exc
                self._connected = True
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    def __repr__(self) -> str:
        return f"NvflareAdminClient(net={self.net_name!r}, connected={self._connected})"

    # --- operations ------------------------------------------------------------------------

    def _system_info(self) -> Any:
        return self._run(lambda session: session.get_system_info())

    def _state_after_failure(self) -> ServerState:
        if self._last_probe is kit_check.ServerProbe.REFUSED:
            return ServerState.UNREACHABLE
        return ServerState.STARTING

    def server_state(self) -> ServerState:
        """Never raises for an unreachable or starting server; AdminMisconfigured escapes."""
        try:
            self._system_info()
        except AdminMisconfigured:
            raise
        except TransientError:
            return self._state_after_failure()
        return ServerState.STARTED

    def server_start_time(self) -> float:
        """The server's start time (epoch seconds) from `check_status server`."""
        info = self._system_info()
        start_time = info.server_info.start_time
        if start_time is None:
            raise UnknownAdminError(f"{self._context()}: server reported no start time")
        return float(start_time)

    def connected_sites(self) -> list[str]:
        """Names of the client sites currently registered with the server."""
        info = self._system_info()
        return sorted(client.name for client in info.client_info)

    def live_runs(self) -> frozenset[str]:
        """The runs of `check_status server`'s job table: nvflare lists the jobs whose
        server-side process this server process runs (its engine's run_processes)."""
        info = self._system_info()
        return frozenset(str(job.job_id) for job in info.job_info if job.job_id)

    def is_ready(self, required_sites: Sequence[str]) -> Readiness:
        """Ready = the server answers an admin command now, every required site is connected.

        A live session (its last command succeeded) is asked first: its answer now proves the
        server serves this admin as well as a new login would, and saves the login (0.1-0.5 s
        per readiness poll). If it fails (a server that restarted, an expired session) it is
        dropped and the check runs on a FRESH login (`_run`); with no session, the check is
        that fresh login. Never raises for "not ready yet"; only AdminMisconfigured escapes.
        """
        with self._lock:
            try:
                info = self._system_info()
            except AdminMisconfigured:
                raise
            except TransientError as exc:
                return Readiness(
                    ready=False, server_state=self._state_after_failure(), detail=str(exc)
                )
        sites = tuple(sorted(client.name for client in info.client_info))
        missing = tuple(site for site in required_sites if site not in sites)
        start_time = info.server_info.start_time
        return Readiness(
            ready=not missing,
            server_state=ServerState.STARTED,
            connected_sites=sites,
            missing_sites=missing,
            detail=f"waiting for sites: {', '.join(missing)}" if missing else "",
            server_start_time=float(start_time) if start_time is not None else None,
        )

    def submit(
        self,
        job_folder: Path,
        submit_token: str,
        *,
        required_sites: Sequence[str] = (),
        resource_spec: Any = None,
    ) -> str:
        """Submit a job folder; a repeated token returns the existing job's id. The sites
        and resource spec are the prepared folder's meta.json's already (unused here)."""
        from nvflare.fuel.flare_api import api_spec as nv

        def operation(session: Any) -> str:
            try:
                return str(session.submit_job(str(job_folder), submit_token=submit_token))
            except nv.SubmitTokenConflict as exc:
                # Same token, different folder content: the token's job exists; it is ours.
                if not exc.existing_job_id:
                    raise
                log.warning(
                    "%s: submit token %s already used for job %s (content differs); keeping it",
                    self._context(),
                    submit_token,
                    exc.existing_job_id,
                )
                return str(exc.existing_job_id)
            except nv.SubmitTokenJobDeleted as exc:
                if not exc.job_id:
                    raise
                log.warning(
                    "%s: submit token %s refers to deleted job %s",
                    self._context(),
                    submit_token,
                    exc.job_id,
                )
                return str(exc.job_id)

        return self._run(operation)

    def find_run(self, submit_token: str) -> str | None:
        """The id of the run submitted with this token (nvflare 2.9 resolves tokens in
        `list_jobs`), or None: settles a submit whose reply was lost without resubmitting."""
        jobs = self._run(lambda session: session.list_jobs(submit_token=submit_token))
        for meta in jobs or []:
            job_id = meta.get("job_id") if isinstance(meta, dict) else None
            if job_id:
                return str(job_id)
        return None

    def job_status(self, nvflare_job_id: str) -> RunStatus:
        """The run's state in the dispatcher's words (see `meta_status`), with when it went
        RUNNING: one command (`get_job_status` reads the same job meta)."""
        meta = self._run(lambda session: session.get_job_meta(nvflare_job_id))
        status = meta_status(meta)
        if status is None:
            raise UnknownAdminError(f"{self._context()}: job {nvflare_job_id} has no status")
        return status

    def _raw_status(self, nvflare_job_id: str) -> str:
        status = self._run(lambda session: session.get_job_status(nvflare_job_id))
        if not status:
            raise UnknownAdminError(f"{self._context()}: job {nvflare_job_id} has no status")
        return str(status)

    def abort(self, nvflare_job_id: str) -> AbortResult:
        """Abort a job. A down server or an unknown job is NOTHING_TO_ABORT, a job the server
        runs in no process NOT_RUNNING, a finished job ALREADY_FINISHED and one it had not
        started yet ABORTED_BEFORE_START (which its job runner may still start), never an
        error."""
        try:
            status = self._status_before_abort(nvflare_job_id)
            if status.startswith("FINISHED"):
                return AbortResult(AbortOutcome.ALREADY_FINISHED, status)
            # The server answers OK for a finished job too, hence the status check first.
            message = self._run(lambda session: session.abort_job(nvflare_job_id))
            if aborted_before_start(status, message):
                return AbortResult(AbortOutcome.ABORTED_BEFORE_START, str(message or status))
        except ServerUnavailable as exc:
            return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"server unavailable: {exc}")
        except NvflareJobNotFound as exc:
            return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"unknown job: {exc}")
        except NvflareJobNotRunning as exc:
            # It may have finished between the status read and the abort.
            return self._not_running_outcome(nvflare_job_id, exc)
        return AbortResult(AbortOutcome.ABORTED, str(message or ""))

    def _status_before_abort(self, nvflare_job_id: str) -> str:
        """The run's status, or "" when the server answers but cannot give one: the abort is
        sent anyway, because a run whose status is unreadable must still be stoppable."""
        try:
            return self._raw_status(nvflare_job_id)
        except UnknownAdminError as exc:
            log.warning(
                "run status unreadable; sending the abort anyway",
                extra={"net": self.net_name, "reason": str(exc)},
            )
            return ""

    def _not_running_outcome(self, nvflare_job_id: str, exc: Exception) -> AbortResult:
        # The server has said it runs the job in no process: that answer stands, whatever
        # the status read (only to tell a run that finished meanwhile) comes back with
        # (UnknownAdminError is transient too).
        try:
            status = self._raw_status(nvflare_job_id)
        except (TransientError, NvflareJobNotFound):
            status = ""
        if status.startswith("FINISHED"):
            return AbortResult(AbortOutcome.ALREADY_FINISHED, status)
        return AbortResult(AbortOutcome.NOT_RUNNING, f"job not running: {exc}")

    def ping(self) -> None:
        """A cheap command that keeps the session alive (`check_status server`)."""
        self._system_info()


def build_admin_client(net: NetConfig, settings: Settings) -> NvflareAdminClient:
    """The admin client of one net, from its validated config."""
    return NvflareAdminClient(
        net_name=net.name,
        kit_dir=net.admin_kit.kit_dir,
        username=net.admin_kit.username,
        login_timeout_s=settings.admin_login_timeout_s,
        command_timeout_s=settings.admin_command_timeout_s,
        login_max_tries=settings.admin_login_max_tries,
        misconfigured_after_s=net.ready_timeout_s,
    )

"""A Flower net's SuperLink, driven through its Control API (flwr 1.42): the operations the
NVFLARE admin client gives the use cases, with the same names, answers and error classes
(`app.adapters.backend.BackendClient`).

The Control API is what the `flwr` CLI itself calls: protobuf messages POSTed over HTTP(S)
to `/v1/control/<method>` on the SuperLink's one port (Fleet and Runtime APIs share it).
The messages are Flower's own, vendored (`proto/`): flwr cannot share this service's
virtualenv, and a typed message beats parsing the CLI's printed output.

What Flower lacks, and how it is made up here:

- No submit token: the run config carries one (`fab.TOKEN_KEY`); `submit` first looks for
  a run with it (a lost reply's run is adopted, never started twice), and `find_run` lists
  the runs to find it. Two workers never submit one token at once: the dispatcher holds a
  lease on the attempt (app.usecases.dispatch).
- No start time: the SuperLink tells none. A restart under a run shows in the run itself:
  an in-memory SuperLink forgets it (NvflareJobNotFound: lost), one with a state database
  marks it finished:failed without the ServerApp's verdict (LOST, `classify.run_status`).
  `server_start_time` answers `NO_START_TIME` once the SuperLink answers (and raises as the
  NVFLARE client does when it does not), so that comparisons of start times never see a
  restart the runs' records have not already told.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from app.adapters.backend import (
    AbortOutcome,
    AbortResult,
    Readiness,
    RunState,
    RunStatus,
    ServerState,
)
from app.adapters.flower import classify
from app.adapters.flower.fab import RESOURCE_SPEC_KEY, SITES_KEY, TOKEN_KEY, build_fab
from app.adapters.flower.proto import control_pb2, fab_pb2, transport_pb2
from app.errors import (
    AdminMisconfigured,
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
M = TypeVar("M")

NO_START_TIME = 0.0  # see the module docstring
PROTOBUF = "application/protobuf"  # flwr.supercore.protobuf.constants.PROTOBUF_MEDIA_TYPE
ONLINE = "online"  # flwr.supercore.constant.NodeStatus.ONLINE
LIVE_STATES = frozenset({"pending", "starting", "running"})
LIST_PAGE = 100  # runs per ListRuns page while looking for a token


def node_name(node: Any) -> str:
    """A SuperNode's name in readiness and `connected_sites`: the name it was registered
    with (`flwr supernode register`, with SuperNode authentication), else `node-<id>`."""
    return str(node.name) if node.name else f"node-{node.node_id}"


def run_token(run: Any) -> str | None:
    """The submit token in a run's config overrides, or None (a run not ours)."""
    value = run.override_config.get(TOKEN_KEY)
    if value is None or value.WhichOneof("scalar") != "string":
        return None
    return str(value.string)


class FlowerControlClient:
    """One Flower net's SuperLink, through its Control API; one HTTP client, a connection
    per call, reopened after any failure (the SuperLink may have restarted behind it)."""

    def __init__(
        self,
        *,
        net_name: str,
        address: str,
        root_certificates: Path | None = None,
        insecure: bool = False,
        timeout_s: float = 10.0,
    ) -> None:
        if insecure and root_certificates is not None:
            raise AdminMisconfigured(
                f"net {net_name!r}: a CA file for the SuperLink's TLS, and insecure (no TLS)"
            )
        self.net_name = net_name
        self.address = address
        self.root_certificates = root_certificates
        self.insecure = insecure
        self.timeout_s = timeout_s
        self._lock = threading.RLock()
        self._http: httpx.Client | None = None
        self._connected = False
        self._last_refused = False

    # --- transport -------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True only if the last command succeeded."""
        return self._connected

    def _context(self) -> str:
        return f"net {self.net_name!r} (SuperLink {self.address})"

    def _client(self) -> httpx.Client:
        if self._http is None:
            verify: ssl.SSLContext | bool = not self.insecure
            if self.root_certificates is not None:
                try:
                    verify = ssl.create_default_context(cafile=str(self.root_certificates))
                except (OSError, ssl.SSLError) as exc:
                    raise AdminMisconfigured(
                        f"{self._context()}: CA file {self.root_certificates}: {exc}"
                    ) from exc
            # No connection outlives its call: the SuperLink's stop waits for every open
            # connection to close, and the worker, housekeeper and api each hold a client of
            # the net (an idle keep-alive one held a compose SuperLink's stop up to the
            # SIGKILL). A call is a TLS handshake more; they are seconds apart.
            self._http = httpx.Client(
                verify=verify,
                timeout=self.timeout_s,
                headers={"connection": "close"},
                limits=httpx.Limits(max_keepalive_connections=0),
            )
        return self._http

    def _call(self, method: str, request: Any, response_type: type[M]) -> M:
        """POST one Control API message and parse the answer, or raise its app error."""
        scheme = "http" if self.insecure else "https"
        url = f"{scheme}://{self.address}/v1/control/{method}"
        with self._lock:
            try:
                answer = self._client().post(
                    url,
                    content=request.SerializeToString(deterministic=True),
                    headers={"content-type": PROTOBUF, "accept": PROTOBUF},
                )
            except httpx.HTTPError as exc:
                self._last_refused = isinstance(exc, httpx.ConnectError)
                self._reset()
                raise classify.classified_transport_error(exc, self._context()) from exc
            self._last_refused = False
            if answer.status_code >= 400:
                error = classify.classified_http_error(answer, self._context())
                # A run-level or request-level answer: the SuperLink serves; else distrust
                # the connection.
                self._connected = isinstance(
                    error, (NvflareJobNotFound, NvflareJobNotRunning, InvalidRequest)
                )
                if not self._connected:
                    self._reset()
                raise error
            message = response_type()
            try:
                message.ParseFromString(answer.content)  # type: ignore[attr-defined]
            except Exception as exc:  # protobuf's DecodeError, untyped here
                self._reset()
                raise UnknownAdminError(
                    f"{self._context()}: {method} answered no {response_type.__name__}"
                ) from exc
            self._connected = True
            return message

    def _reset(self) -> None:
        http, self._http = self._http, None
        self._connected = False
        if http is not None:
            http.close()

    def close(self) -> None:
        """Close the connection pool (nothing else is held between calls)."""
        with self._lock:
            self._reset()

    def __enter__(self) -> FlowerControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FlowerControlClient(net={self.net_name!r}, connected={self._connected})"

    # --- server ----------------------------------------------------------------------------

    def _nodes(self) -> list[Any]:
        answer = self._call(
            "list-nodes", control_pb2.ListNodesRequest(), control_pb2.ListNodesResponse
        )
        return list(answer.nodes_info)

    def _state_after_failure(self) -> ServerState:
        return ServerState.UNREACHABLE if self._last_refused else ServerState.STARTING

    def server_state(self) -> ServerState:
        """Never raises for an unreachable or starting SuperLink; AdminMisconfigured escapes."""
        try:
            self._nodes()
        except AdminMisconfigured:
            raise
        except TransientError:
            return self._state_after_failure()
        return ServerState.STARTED

    def server_start_time(self) -> float:
        """NO_START_TIME once the SuperLink answers (it tells no start time; see the module
        docstring); ServerUnavailable and the rest as any command when it does not."""
        self._nodes()
        return NO_START_TIME

    def connected_sites(self) -> list[str]:
        """The names of the SuperNodes online now."""
        return sorted(node_name(node) for node in self._nodes() if node.status == ONLINE)

    def is_ready(self, required_sites: Sequence[str]) -> Readiness:
        """Ready = the Control API answers and every required SuperNode is online (by its
        registered name). Never raises for "not ready yet"; AdminMisconfigured escapes."""
        try:
            nodes = self._nodes()
        except AdminMisconfigured:
            raise
        except TransientError as exc:
            return Readiness(ready=False, server_state=self._state_after_failure(), detail=str(exc))
        online = tuple(sorted(node_name(node) for node in nodes if node.status == ONLINE))
        missing = tuple(site for site in required_sites if site not in online)
        return Readiness(
            ready=not missing,
            server_state=ServerState.STARTED,
            connected_sites=online,
            missing_sites=missing,
            detail=f"waiting for SuperNodes: {', '.join(missing)}" if missing else "",
            server_start_time=NO_START_TIME,
        )

    def ping(self) -> None:
        """A cheap command (ListNodes): proves the SuperLink answers."""
        self._nodes()

    # --- runs ------------------------------------------------------------------------------

    def _runs(self, run_id: int | None = None, skip: int = 0) -> dict[int, Any]:
        if run_id is not None:
            request = control_pb2.ListRunsRequest(run_id=run_id)
        else:
            request = control_pb2.ListRunsRequest(limit=LIST_PAGE, skip=skip)
        answer = self._call("list-runs", request, control_pb2.ListRunsResponse)
        return dict(answer.run_dict)

    def _run(self, run_id: str) -> Any:
        """The run's record; NvflareJobNotFound when the SuperLink has none."""
        number = _run_number(run_id, self._context())
        return self._runs(number)[number]

    def _all_runs(self) -> list[Any]:
        """Every run of the SuperLink, newest first (ListRuns pages by `pending_at`)."""
        runs: list[Any] = []
        while True:
            page = self._runs(skip=len(runs))
            runs.extend(page.values())
            if len(page) < LIST_PAGE:
                return runs

    def submit(
        self,
        job_folder: Path,
        submit_token: str,
        *,
        required_sites: Sequence[str] = (),
        resource_spec: Any = None,
    ) -> str:
        """Start a run of the Flower App in `job_folder` with the token in its run config; a
        token already used returns that run's id (nothing is started twice). The job's
        sites (a JSON list of SuperNode names) and resource spec (a JSON object, when it has
        one) go into the run config beside it (`fab.SITES_KEY`, `fab.RESOURCE_SPEC_KEY`)."""
        fab = build_fab(job_folder)
        existing = self.find_run(submit_token)
        if existing is not None:
            log.warning(
                "%s: submit token %s already started run %s; keeping it",
                self._context(),
                submit_token,
                existing,
            )
            return existing
        config = {TOKEN_KEY: submit_token, SITES_KEY: json.dumps(list(required_sites))}
        if resource_spec is not None:
            config[RESOURCE_SPEC_KEY] = json.dumps(resource_spec, sort_keys=True)
        request = control_pb2.StartRunRequest(
            fab=fab_pb2.Fab(content=fab),
            override_config={
                key: transport_pb2.Scalar(string=value) for key, value in config.items()
            },
        )
        answer = self._call("start-run", request, control_pb2.StartRunResponse)
        if not answer.HasField("run_id"):
            # The SuperLink logged why (a FAB over its size limit answers so); not retried.
            raise InvalidRequest(f"{self._context()}: the SuperLink started no run")
        return self._first_with_token(str(answer.run_id), submit_token)

    def _first_with_token(self, started: str, submit_token: str) -> str:
        """The token's first run: `started` unless another submit with the same token
        started one before it (the lookup and the start-run are two calls, and a worker
        paused between them while a retry or reconcile started the attempt's run: simulation
        seed 561). Then `started` is stopped, still pending (a stop is final: it never runs),
        and the first one is kept, so every racer answers the same run (`find_run`)."""
        first = self._keep_first(submit_token)
        return started if first is None else first

    def find_run(self, submit_token: str) -> str | None:
        """The id of the first run started with this token, or None if the SuperLink has
        none. The first, as `submit` keeps it: any later one still live is stopped here,
        before it runs, and a stop that does not land raises (ServerUnavailable, or what the
        stop raised) rather than answer while the later run may still start: the caller
        retries, and the retry's lookup stops it (tests/unit/test_flower_submit_race.py)."""
        return self._keep_first(submit_token)

    def _keep_first(self, submit_token: str) -> str | None:
        """`find_run`, also the submit's re-check after its start-run."""
        runs = [run for run in self._all_runs() if run_token(run) == submit_token]
        if not runs:
            return None
        first = str(_first(runs).run_id)
        for run in runs:
            later = str(run.run_id)
            if later != first and run.status.status in LIVE_STATES:
                self._stop_later(later, first, submit_token)
        return first

    def _stop_later(self, later: str, first: str, submit_token: str) -> None:
        """Stop a later run of the token; raise unless it is over (or gone) afterwards."""
        result = self.abort(later)
        if result.outcome is AbortOutcome.NOTHING_TO_ABORT:
            # A down SuperLink answers so as well as an unknown run: the run's record says.
            try:
                status = self._run(later).status.status
            except NvflareJobNotFound:
                status = None
            if status in LIVE_STATES:
                raise ServerUnavailable(
                    f"{self._context()}: run {later} of submit token {submit_token} (a later "
                    f"run than {first}) not stopped yet: {result.detail}"
                )
        log.warning(
            "%s: submit token %s had started run %s first; run %s stopped",
            self._context(),
            submit_token,
            first,
            later,
        )

    def job_status(self, nvflare_job_id: str) -> RunStatus:
        """The run's state (classify.run_status); NvflareJobNotFound if the SuperLink has
        no such run (an in-memory SuperLink forgets every run when it restarts)."""
        run = self._run(nvflare_job_id)
        return classify.run_status(
            run.status.status, run.status.sub_status, run.status.details, run.running_at
        )

    def live_runs(self) -> frozenset[str]:
        """The runs the SuperLink has not finished (pending, starting or running)."""
        return frozenset(
            str(run.run_id) for run in self._all_runs() if run.status.status in LIVE_STATES
        )

    def abort(self, nvflare_job_id: str) -> AbortResult:
        """Stop a run. A down SuperLink or an unknown run is NOTHING_TO_ABORT, a finished one
        ALREADY_FINISHED; never an error. A stop is final in Flower: the run is marked
        finished:stopped at once, and a run not started yet is never started."""
        try:
            number = _run_number(nvflare_job_id, self._context())
            request = control_pb2.StopRunRequest(run_id=number)
            answer = self._call("stop-run", request, control_pb2.StopRunResponse)
        except ServerUnavailable as exc:
            return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"SuperLink unavailable: {exc}")
        except NvflareJobNotFound as exc:
            return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"unknown run: {exc}")
        except NvflareJobNotRunning as exc:
            return AbortResult(AbortOutcome.ALREADY_FINISHED, str(exc))
        if answer.success:
            return AbortResult(AbortOutcome.ABORTED, "Flower finished:stopped")
        # Not stopped: it finished meanwhile, or the SuperLink could not say; its record
        # decides (any error from that read is the caller's to retry).
        status = self.job_status(nvflare_job_id)
        if status.state is not RunState.RUNNING:
            return AbortResult(AbortOutcome.ALREADY_FINISHED, status.detail)
        raise UnknownAdminError(f"{self._context()}: run {nvflare_job_id} was not stopped")


def _first(runs: list[Any]) -> Any:
    """The run created first (`pending_at`, then the id, should two share a moment)."""
    return min(runs, key=lambda run: (run.pending_at, run.run_id))


def _run_number(run_id: str, context: str) -> int:
    """A Flower run id (an unsigned 64-bit number) from the string the job table keeps."""
    try:
        number = int(run_id)
    except ValueError:
        number = -1
    if not 0 <= number < 2**64:
        raise NvflareJobNotFound(f"{context}: {run_id!r} is no Flower run id")
    return number


def build_flower_client(net: NetConfig, settings: Settings) -> FlowerControlClient:
    """The Control API client of one Flower net, from its validated config."""
    if net.flower is None:  # NetConfig refuses a Flower net without its [flower]
        raise AdminMisconfigured(f"net {net.name!r} has no [flower] SuperLink address")
    return FlowerControlClient(
        net_name=net.name,
        address=net.flower.address,
        root_certificates=net.flower.root_certificates,
        insecure=net.flower.insecure,
        timeout_s=settings.admin_command_timeout_s,
    )

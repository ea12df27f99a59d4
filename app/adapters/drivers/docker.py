"""The `docker` scale driver: a net's fl-server is a container on a Docker engine (or podman's
Docker-compatible API service), started for a job and stopped after it.

The driver only starts, stops and inspects a container that already exists; it never
creates, changes or removes one. A missing container is a misconfiguration naming it, not
something to make. Why not create it from a spec in the nets file:
- the container's definition (image, the server's startup kit mounted, its network, the
  port the sites connect to) belongs with the rest of the deployment, in compose.yml, where
  the operator reviews it and `docker compose create fl-server` makes it once;
- create is the dangerous call of the Engine API: whoever may create a container may mount
  the host's / into it and is root on the host. Start, stop and inspect of named
  containers is what a socket proxy can allow and nothing more
  (app/policies/docker-socket-proxy.haproxy.cfg; app/adapters/README.md "Docker driver").

Three Engine API calls, one HTTP request each: `POST /containers/{name}/start` (304 when
it already runs), `POST /containers/{name}/stop?t=N` (304 when it is already stopped), and
`GET /containers/{name}/json`. The engine keeps no intent for us: a container that is not
running reads as desired 0 (nothing runs it again until a start is asked for). How it last
ended is kept as `failure` when it was not by a stop (exit 0, or 143/137: SIGTERM, or the
SIGKILL that follows it after `stop_timeout_s`): another exit code, killed out of memory,
dead. Whether that exit fails the start now wanted is the caller's to judge, as only the
dispatcher knows when it last asked for a start (an exit seen after that request is that
start's failure, and readiness gives up at once instead of waiting out `ready_timeout_s`;
an exit from before it, a crash long ago, is history). A server killed by a plain SIGKILL
from outside the engine reads as stopped (it ends exactly as a stop that timed out does).
"""

from __future__ import annotations

import logging
import signal
from typing import Any, NoReturn

import docker
import docker.errors
import requests.exceptions

from app.adapters.drivers.base import Observation
from app.errors import DriverMisconfigured, DriverTransientError
from app.net_config import DockerDriverConfig

log = logging.getLogger(__name__)

# Pinned so that building a client never calls the engine (the SDK's "auto" asks it for its
# version first). 1.41 is Docker 20.10's and what podman 4's compatible service serves. The
# socket proxy's policy (app/policies/docker-socket-proxy.haproxy.cfg) lets this version
# through and no other (older ones let a start carry a HostConfig): change both together.
DOCKER_API_VERSION = "1.41"

# How a container ends when it is stopped: its server exits cleanly (0) or by the stop
# signal (128 + SIGTERM), or the engine kills it when stop_timeout_s runs out.
STOPPED_EXIT_CODES = frozenset({0, 128 + signal.SIGTERM, 128 + signal.SIGKILL})


class DockerDriver:
    """Starts (1) and stops (0) one net's fl-server container."""

    kind = "docker"

    def __init__(
        self, net_name: str, config: DockerDriverConfig, client: docker.APIClient | None = None
    ) -> None:
        self.net_name = net_name
        self.config = config
        self.client = client or docker.APIClient(
            base_url=config.engine_url, version=DOCKER_API_VERSION, timeout=config.api_timeout_s
        )

    @property
    def target(self) -> str:
        """How errors and logs name the container: its name and its engine."""
        return f"container {self.config.container} on {self.config.engine_url}"

    def scale(self, replicas: int) -> None:
        """Start (1) or stop (0) the container; idempotent (the engine answers 304 to a
        start of a running container and to a stop of a stopped one)."""
        if replicas not in (0, 1):
            raise ValueError(f"net {self.net_name}: a container has 0 or 1 replicas")
        name = self.config.container
        if replicas == 1:
            self._call("start", self.client.start, name)
            log.info("net %s: %s started", self.net_name, self.target)
        else:
            # The SDK waits stop_timeout_s on top of the API timeout for this one call.
            self._call("stop", self.client.stop, name, timeout=self.config.stop_timeout_s)
            log.info("net %s: %s stopped", self.net_name, self.target)

    def observe(self) -> Observation:
        """Running from the engine's state; a stopped container that did not end by a stop
        says how it ended (see the module docstring)."""
        inspected = self._call("inspect", self.client.inspect_container, self.config.container)
        return observed(inspected.get("State") or {})

    def _call(self, operation: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            _classify(exc, operation, self.target)


def observed(state: dict[str, Any]) -> Observation:
    """An Observation from the `State` of an inspected container."""
    status = str(state.get("Status", ""))
    if status == "running":
        return Observation(desired=1, running=1, pending=0)
    if status == "restarting":  # its restart policy brings it back
        return Observation(desired=1, running=0, pending=1)
    if status == "paused":
        return Observation(desired=1, running=0, pending=0, failure="container is paused")
    exit_code = int(state.get("ExitCode") or 0)
    ended = f"at {state['FinishedAt']}" if state.get("FinishedAt") else ""
    error = f": {state['Error']}" if state.get("Error") else ""
    if state.get("OOMKilled"):
        failure = f"container was killed out of memory {ended}{error}"
    elif status == "dead":
        failure = f"container is dead {ended}{error}"
    elif exit_code not in STOPPED_EXIT_CODES:
        failure = f"container exited on its own with code {exit_code} {ended}{error}"
    else:  # created (never started), or exited as a stop ends it
        return Observation(desired=0, running=0, pending=0)
    # Not desired: the engine will not run it again (a restart policy would read as
    # "restarting"), so a stopped net with an old crash is no drift to stop over and over.
    return Observation(desired=0, running=0, pending=0, failure=failure.replace("  ", " "))


def _classify(exc: Exception, operation: str, target: str) -> NoReturn:
    """Raise the dispatcher's error class for an Engine API failure, keeping it as
    __cause__: what will keep failing until someone changes the deployment is
    DriverMisconfigured; an engine that is down, restarting or failing is transient."""
    if isinstance(exc, docker.errors.NotFound):
        raise DriverMisconfigured(
            f"{target}: no such container ({operation}); create it first "
            "(`docker compose create` with the fl-server service), the driver never does"
        ) from exc
    if isinstance(exc, docker.errors.APIError):
        status = exc.status_code or 0
        detail = exc.explanation or str(exc)
        message = f"{target}: {operation} failed: HTTP {status}: {detail}"
        if status >= 500 or status in (408, 429):
            raise DriverTransientError(message) from exc
        # 401/403 (a socket proxy refusing the call), 409 (a container being removed), ...
        raise DriverMisconfigured(message) from exc
    if isinstance(exc, requests.exceptions.RequestException):
        # Socket missing or refused (engine down or restarting), timeouts, a reset.
        raise DriverTransientError(
            f"{target}: {operation}: engine unreachable: {type(exc).__name__}: {exc}"
        ) from exc
    # The SDK's own refusals (a malformed engine_url and the like) do not heal by waiting.
    raise DriverMisconfigured(f"{target}: {operation}: {type(exc).__name__}: {exc}") from exc

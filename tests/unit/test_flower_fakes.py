"""The simulator's Flower client (app/sim/flower_admin.py) answers as the real Flower adapter
(app/adapters/flower/client.py) does, both over one fake SuperLink (app/sim/superlink.py):
the real client through a Control API that serves the fake's state (`_ControlApi`: its
protobuf messages and flwr 1.42's error codes), the fake directly. Each case is a scenario
played once with each client; the expected answers are what tests/integration/
test_flower_backend.py pins against a real SuperLink (readiness, a submit once per token, a
lost submit reply found again, the run states, a stop of a pending or running run, a
SuperLink down, a restart in memory or with a database), and, where flwr's source decides it
(a pending run in the database of a restarted SuperLink is claimed by the new one), that."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.adapters.backend import AbortOutcome, AdminClient, RunState, ServerState
from app.adapters.flower.client import NO_START_TIME, FlowerControlClient
from app.adapters.flower.fab import TOKEN_KEY
from app.adapters.flower.proto import control_pb2, node_pb2, run_pb2
from app.errors import DispatcherError
from app.sim import superlink
from app.sim.clock import SimClock
from app.sim.cluster import Cluster
from app.sim.faults import CLEAN, FaultProfile
from app.sim.flower_admin import FlowerSimAdmin
from app.sim.superlink import SuperLink
from app.sim.workload import JobSpec, NetSpec
from tests.fixtures.flower import APP

NET = "net-f"
SITES = ("site-1", "site-2")
JOB = str(uuid.UUID(int=1))  # a token names its job: the fake server finds its spec
FAILING = str(uuid.UUID(int=2))
CUT_OFF = str(uuid.UUID(int=3))
SHORT = str(uuid.UUID(int=4))
EXECUTION_EXCEPTION = "FINISHED:EXECUTION_EXCEPTION"  # the fault profile's failed run (FAILED)


class _Host:
    """What the simulator's platform calls back: no hook does anything; no fault unless a
    case asks for one."""

    def __init__(self) -> None:
        self.clock = SimClock()
        self.rng = random.Random(0)
        self.rng_msg = random.Random(1)
        self.faults: FaultProfile = CLEAN
        self.specs = {
            JOB: JobSpec("long", 0.0, duration_s=None),
            SHORT: JobSpec("short", 0.0, duration_s=20.0),
            FAILING: JobSpec(
                "failing", 0.0, duration_s=20.0, outcome="FINISHED:EXECUTION_EXCEPTION"
            ),
            CUT_OFF: JobSpec("cut off", 0.0, duration_s=20.0, outcome="FINISHED:ABNORMAL"),
        }

    def trace(self, line: str) -> None: ...

    def hook(self, point: str, net: str | None) -> None: ...

    def reader(self) -> int | None:
        return None

    def report(self, invariant: str, subject: str, detail: str) -> None: ...

    def on_submit(self, net: str, token: str, folder: Path, *, repeat: bool = False) -> None: ...

    def on_scale(self, net: str, replicas: int) -> None: ...

    def job_spec(self, job_id: str) -> JobSpec | None:
        return self.specs.get(job_id)

    def scales_to_zero(self, net: str) -> bool:
        return True


def _err(status: int, code: int, detail: str) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "detail": detail})


@dataclass
class _ControlApi:
    """A SuperLink's Control API (the four calls the adapter makes) over the fake's state."""

    world: World
    lose_next_start: bool = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        w = self.world
        w.cluster.advance(w.clock.t)
        server = w.server
        if server.up_at is None:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if not server.answering(w.clock.t):
            return httpx.Response(503, content=b"starting")  # no Flower body: try later
        method = request.url.path.rsplit("/", 1)[1]
        handler: Callable[[httpx.Request], httpx.Response] = getattr(self, method.replace("-", "_"))
        return handler(request)

    def list_nodes(self, request: httpx.Request) -> httpx.Response:
        online = self.world.server.sites(self.world.clock.t)
        nodes = [
            node_pb2.NodeInfo(node_id=i, name=s, status="online") for i, s in enumerate(online)
        ]
        return _proto(control_pb2.ListNodesResponse(nodes_info=nodes))

    def list_runs(self, request: httpx.Request) -> httpx.Response:
        asked = control_pb2.ListRunsRequest.FromString(request.content)
        t = self.world.clock.t
        runs = list(reversed(self.world.server.store.values()))  # newest first
        if asked.HasField("run_id"):
            runs = [r for r in runs if int(r.nvflare_id) == asked.run_id]
            if not runs:
                return _err(404, 16, "Run ID not found")  # RUN_ID_NOT_FOUND
        else:
            runs = runs[asked.skip : asked.skip + asked.limit]
        answer = control_pb2.ListRunsResponse()
        for run in runs:
            status, sub_status, details, running_at = superlink.record(run, t)
            answer.run_dict[int(run.nvflare_id)].CopyFrom(
                run_pb2.Run(
                    run_id=int(run.nvflare_id),
                    running_at=running_at,
                    status=run_pb2.RunStatus(status=status, sub_status=sub_status, details=details),
                )
            )
            answer.run_dict[int(run.nvflare_id)].override_config[TOKEN_KEY].string = run.token
        return _proto(answer)

    def start_run(self, request: httpx.Request) -> httpx.Response:
        asked = control_pb2.StartRunRequest.FromString(request.content)
        token = asked.override_config[TOKEN_KEY].string
        run = self.world.cluster.submit(self.world.server, token, self.world.clock.t)
        if self.lose_next_start:
            self.lose_next_start = False
            raise httpx.ReadError("connection closed before the answer", request=request)
        return _proto(control_pb2.StartRunResponse(run_id=int(run.nvflare_id)))

    def stop_run(self, request: httpx.Request) -> httpx.Response:
        asked = control_pb2.StopRunRequest.FromString(request.content)
        run = self.world.server.store.get(str(asked.run_id))
        t = self.world.clock.t
        if run is None:
            return _err(404, 16, "Run ID not found")
        if superlink.record(run, t)[0] == superlink.FINISHED:
            return _err(400, 18, "Run already finished")  # RUN_ALREADY_FINISHED
        run.aborted_at = t
        return _proto(control_pb2.StopRunResponse(success=True))


def _proto(message: Any) -> httpx.Response:
    return httpx.Response(
        200, content=message.SerializeToString(), headers={"content-type": "application/protobuf"}
    )


class _RealOverFake(FlowerControlClient):
    """The real adapter, its HTTP connection served by `_ControlApi`."""

    def __init__(self, api: _ControlApi) -> None:
        super().__init__(net_name=NET, address=f"{NET}.superlink:9093", insecure=True)
        self.api = api

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(transport=httpx.MockTransport(self.api))
        return self._http


@dataclass
class World:
    """One fake SuperLink (always-on: up before the case starts), and one client of it."""

    keeps_jobs: bool = False
    real: bool = False
    host: _Host = field(default_factory=_Host)
    client: AdminClient = field(init=False)
    api: _ControlApi = field(init=False)
    cluster: Cluster = field(init=False)

    def __post_init__(self) -> None:
        spec = NetSpec(NET, kind="static", backend="flower", keeps_jobs=self.keeps_jobs)
        self.cluster = Cluster(self.host, (spec,), random.Random(0), flower_rng=random.Random(0))
        self.api = _ControlApi(self)
        self.client = _RealOverFake(self.api) if self.real else FlowerSimAdmin(self.cluster, NET)

    @property
    def clock(self) -> SimClock:
        return self.host.clock

    @property
    def server(self) -> SuperLink:
        server = self.cluster.servers[NET]
        assert isinstance(server, SuperLink)
        return server

    def later(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.cluster.advance(self.clock.t)

    def crash(self, down_s: float) -> None:
        self.cluster.crash(NET, self.clock.t, down_s)

    @contextmanager
    def reply_lost(self) -> Iterator[None]:
        """The next start-run's reply is lost after the SuperLink acted on it."""
        self.api.lose_next_start = True
        self.host.faults = CLEAN.with_(lost_reply=1.0)
        try:
            yield
        finally:
            self.host.faults = CLEAN

    def runs_of(self, token: str) -> int:
        return sum(run.token == token for run in self.server.store.values())

    def submit(self, token: str) -> str:
        return self.client.submit(APP, token)


def token(job: str, attempt: int = 0) -> str:
    return f"{job}-{attempt}"


def _error(call: Callable[[], object]) -> str:
    try:
        call()
    except DispatcherError as exc:
        return type(exc).__name__
    return "answered"


# --- the cases: each returns what the client answered, in plain values -------------------


def readiness(w: World) -> tuple[object, ...]:
    w.crash(1000.0)  # down, then back 1000 s later
    down = w.client.is_ready(SITES)
    w.later(1000.0)  # up: the Control API answers (once booted) before the SuperNodes connect
    w.later(w.server.boot_s + 0.01)
    none = w.client.is_ready(SITES)
    w.later(60.0)
    both = w.client.is_ready(SITES)
    return (
        (down.ready, down.server_state),
        (none.server_state, none.missing_sites, none.server_start_time),
        (both.ready, both.connected_sites, both.server_start_time),
        w.client.server_start_time(),
        w.client.server_state(),
    )


def once_per_token(w: World) -> tuple[object, ...]:
    run_id = w.submit(token(SHORT))
    again = w.submit(token(SHORT))
    found, other = w.client.find_run(token(SHORT)), w.client.find_run(token(SHORT, 1))
    w.later(100.0)
    return (
        again == run_id,
        found == run_id,
        other,
        w.runs_of(token(SHORT)),
        w.client.job_status(run_id).state,
        w.client.abort(run_id).outcome,
    )


def lost_submit_reply(w: World) -> tuple[object, ...]:
    with w.reply_lost():
        first = _error(lambda: w.submit(token(SHORT)))
    found = w.client.find_run(token(SHORT))
    adopted = w.submit(token(SHORT))
    w.later(100.0)
    assert found is not None
    return first, adopted == found, w.runs_of(token(SHORT)), w.client.job_status(found).state


def run_states(w: World) -> tuple[object, ...]:
    long_id, failing, cut_off = (w.submit(token(j)) for j in (JOB, FAILING, CUT_OFF))
    pending = w.client.job_status(long_id)
    w.later(60.0)
    running = w.client.job_status(long_id)
    return (
        (pending.state, pending.started_at),
        (running.state, running.started_at is not None, long_id in w.client.live_runs()),
        w.client.job_status(failing).state,
        w.client.job_status(cut_off).state,
        failing in w.client.live_runs(),
    )


def stop_pending(w: World) -> tuple[object, ...]:
    run_id = w.submit(token(JOB))
    stopped = w.client.abort(run_id).outcome
    w.later(100.0)
    status = w.client.job_status(run_id)
    return stopped, status.state, status.started_at, run_id in w.client.live_runs()


def stop_running(w: World) -> tuple[object, ...]:
    run_id = w.submit(token(JOB))
    w.later(30.0)
    stopped = w.client.abort(run_id).outcome
    return (
        stopped,
        w.client.job_status(run_id).state,
        w.client.abort(run_id).outcome,
        w.client.abort("123").outcome,  # a run the SuperLink never had
        run_id in w.client.live_runs(),
    )


def superlink_down(w: World) -> tuple[object, ...]:
    run_id = w.submit(token(JOB))
    w.later(30.0)
    w.crash(1000.0)
    return (
        w.client.abort(run_id).outcome,
        w.client.connected,
        _error(w.client.server_start_time),
        _error(lambda: w.client.job_status(run_id)),
    )


def restart_in_memory(w: World) -> tuple[object, ...]:
    run_id = w.submit(token(JOB))
    w.later(30.0)
    w.crash(2.0)
    w.later(30.0)
    return (
        _error(lambda: w.client.job_status(run_id)),
        w.client.live_runs(),
        w.client.find_run(token(JOB)),
    )


def restart_with_database(w: World) -> tuple[object, ...]:
    run_id = w.submit(token(JOB))
    w.later(30.0)
    w.crash(2.0)
    w.later(10.0)
    before = w.client.job_status(run_id).state, run_id in w.client.live_runs()
    w.later(60.0)  # past its task's expiry
    return (
        w.client.find_run(token(JOB)) == run_id,
        before,
        w.client.job_status(run_id).state,
        run_id in w.client.live_runs(),
    )


def pending_through_a_restart(w: World) -> tuple[object, ...]:
    run_id = w.submit(token(SHORT))
    w.crash(2.0)  # before the SuperExec claimed it: it waits in the database
    w.later(15.0)
    status = w.client.job_status(run_id)
    w.later(60.0)
    return status.state, status.started_at is not None, w.client.job_status(run_id).state


R = RunState
CASES: dict[str, tuple[Callable[[World], tuple[object, ...]], bool, tuple[object, ...]]] = {
    "readiness": (
        readiness,
        False,
        (
            (False, ServerState.UNREACHABLE),
            (ServerState.STARTED, SITES, NO_START_TIME),
            (True, SITES, NO_START_TIME),
            NO_START_TIME,
            ServerState.STARTED,
        ),
    ),
    "once per token": (
        once_per_token,
        False,
        (True, True, None, 1, R.COMPLETED, AbortOutcome.ALREADY_FINISHED),
    ),
    "lost submit reply": (lost_submit_reply, False, ("ServerUnavailable", True, 1, R.COMPLETED)),
    "run states": (
        run_states,
        False,
        ((R.RUNNING, None), (R.RUNNING, True, True), R.FAILED, R.LOST, False),
    ),
    "stop pending": (stop_pending, False, (AbortOutcome.ABORTED, R.ABORTED, None, False)),
    "stop running": (
        stop_running,
        False,
        (
            AbortOutcome.ABORTED,
            R.ABORTED,
            AbortOutcome.ALREADY_FINISHED,
            AbortOutcome.NOTHING_TO_ABORT,
            False,
        ),
    ),
    "SuperLink down": (
        superlink_down,
        False,
        (AbortOutcome.NOTHING_TO_ABORT, False, "ServerUnavailable", "ServerUnavailable"),
    ),
    "restart in memory": (
        restart_in_memory,
        False,
        ("NvflareJobNotFound", frozenset(), None),
    ),
    "restart with a database": (
        restart_with_database,
        True,
        (True, (R.RUNNING, True), R.LOST, False),
    ),
    "pending through a restart": (pending_through_a_restart, True, (R.RUNNING, True, R.COMPLETED)),
}


@pytest.mark.parametrize("case", CASES)
def test_the_flower_fake_answers_as_the_real_adapter(case: str) -> None:
    scenario, keeps_jobs, expected = CASES[case]
    fake = scenario(World(keeps_jobs=keeps_jobs))
    real = scenario(World(keeps_jobs=keeps_jobs, real=True))
    assert real == expected, "the real adapter over the fake SuperLink"
    assert fake == expected, "the simulator's Flower client"

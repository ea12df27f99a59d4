"""The Flower backend's client against a real SuperLink and two real SuperNodes (flwr 1.42,
from their own virtualenv: tests/fixtures/flower.py), TLS on loopback: readiness,
submit, status, stop, a SuperLink down or restarted under a run, and a lost submit reply."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.adapters.backend import AbortOutcome, RunState, RunStatus, ServerState
from app.adapters.flower import fab
from app.adapters.flower.client import NO_START_TIME, FlowerControlClient, run_token
from app.adapters.flower.proto import control_pb2
from app.errors import AdminMisconfigured, NvflareJobNotFound, ServerUnavailable
from app.local.flower import build_flower_app
from tests.fixtures.flower import APP, SITES, FlowerSystem, make_tls, poll

pytestmark = [pytest.mark.integration, pytest.mark.flower]

EXPECTED_S = 210  # seconds on the 2-core CI machine (tests/tools/schedule.py): 204 s measured

RUN_TIMEOUT_S = 120.0  # measured ~9 s for the tiny app's one round on 2 cores


def app_variant(tmp_path: Path, name: str, **config: object) -> Path:
    """A copy of the tiny Flower App with other defaults in its run config."""
    return build_flower_app(tmp_path / name, **config)


@pytest.fixture
def long_app(tmp_path: Path) -> Path:
    """The app with rounds enough to be running still when a test stops or crashes it."""
    return app_variant(tmp_path, "long", **{"num-rounds": 1000, "round-sleep-s": 0.5})


@pytest.fixture
def make_client() -> Iterator[Callable[..., FlowerControlClient]]:
    """Clients of a system's SuperLink (trusting its test CA), all closed after the test."""
    clients: list[FlowerControlClient] = []

    def make(system: FlowerSystem) -> FlowerControlClient:
        client: FlowerControlClient = system.client()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def flower(flower_system: FlowerSystem) -> FlowerSystem:
    """The in-memory SuperLink runs and both SuperNodes are online."""
    flower_system.ensure()
    return flower_system


def finished(client: FlowerControlClient, run_id: str) -> RunStatus:
    """Wait until the run is no longer RUNNING; its final status."""

    def read() -> RunStatus | None:
        status = client.job_status(run_id)
        return status if status.state is not RunState.RUNNING else None

    result: RunStatus = poll(f"run {run_id} to finish", read, RUN_TIMEOUT_S, 0.5)
    return result


def running(client: FlowerControlClient, run_id: str) -> RunStatus:
    """Wait until the run's ServerApp runs (its `running_at` set)."""

    def read() -> RunStatus | None:
        status = client.job_status(run_id)
        assert status.state is RunState.RUNNING, status
        return status if status.started_at is not None else None

    result: RunStatus = poll(f"run {run_id} to run", read, RUN_TIMEOUT_S, 0.5)
    return result


def runs_with_token(system: FlowerSystem, token: str) -> list[Any]:
    """Every run of the SuperLink whose config carries this token (read without the client
    under test's own lookup)."""
    answer = httpx.post(
        f"https://{system.address}/v1/control/list-runs",
        content=control_pb2.ListRunsRequest(limit=1000).SerializeToString(),
        headers={"content-type": "application/protobuf"},
        timeout=10,
        verify=system.tls.context(),
    )
    answer.raise_for_status()
    runs = control_pb2.ListRunsResponse()
    runs.ParseFromString(answer.content)
    return [run for run in runs.run_dict.values() if run_token(run) == token]


def test_vendored_protos_are_the_superlinks(flower_venv: Path) -> None:
    """app/adapters/flower/proto is the flwr of .ci/flower.lock, imports repointed only."""
    vendored = Path(__file__).resolve().parents[2] / "app" / "adapters" / "flower" / "proto"
    sources = list(flower_venv.glob("lib/python*/site-packages/flwr/proto"))
    assert len(sources) == 1
    names = sorted(p.name for p in vendored.iterdir() if p.suffix in {".py", ".pyi"})
    assert len(names) == 2 * 12 + 1  # 12 modules, their stubs, __init__.py
    for name in names:
        if name == "__init__.py":
            continue
        original = (sources[0] / name).read_text()
        original = re.sub(
            r"(?m)^from flwr\.proto import ", "from app.adapters.flower.proto import ", original
        )
        original = re.sub(
            r"(?m)^import flwr\.proto\.(\w*)$", r"import app.adapters.flower.proto.\1", original
        )
        original = re.sub(r"\bflwr\.proto\.(\w*_pb2)\b", r"app.adapters.flower.proto.\1", original)
        assert (vendored / name).read_text() == original, name


def test_not_ready_until_both_supernodes_connect(
    flower_system: FlowerSystem, make_client: Callable[..., FlowerControlClient]
) -> None:
    system = flower_system
    for site in SITES:
        system.stop_supernode(site)
    system.stop_superlink()
    client = make_client(system)

    down = client.is_ready(SITES)
    assert (down.ready, down.server_state) == (False, ServerState.UNREACHABLE)
    assert client.server_state() is ServerState.UNREACHABLE

    system.start_superlink()
    system.register_nodes()
    none = client.is_ready(SITES)
    assert (none.ready, none.server_state, none.missing_sites) == (
        False,
        ServerState.STARTED,
        SITES,
    )
    assert none.server_start_time == NO_START_TIME

    system.start_supernode("site-1")
    one = poll("site-1 online", lambda: (r := client.is_ready(SITES)).connected_sites and r, 60)
    assert (one.ready, one.connected_sites, one.missing_sites) == (False, ("site-1",), ("site-2",))

    system.start_supernode("site-2")
    both = poll("both online", lambda: (r := client.is_ready(SITES)).ready and r, 60)
    assert both.connected_sites == SITES
    assert client.connected_sites() == list(SITES)
    assert client.server_state() is ServerState.STARTED
    assert client.connected


def test_a_superlink_whose_certificate_another_ca_signed_is_misconfigured(
    flower: FlowerSystem, tmp_path: Path
) -> None:
    """Not "down": the net points at another SuperLink, or holds the wrong CA file."""
    other = make_tls(tmp_path / "other", "another CA")
    with FlowerControlClient(
        net_name="flower-test", address=flower.address, root_certificates=other.ca
    ) as client:
        with pytest.raises(AdminMisconfigured, match="CERTIFICATE_VERIFY_FAILED"):
            client.is_ready(SITES)
        with pytest.raises(AdminMisconfigured):
            client.server_state()


def test_submit_runs_to_completed_once_per_token(
    flower: FlowerSystem, make_client: Callable[..., FlowerControlClient]
) -> None:
    client = make_client(flower)
    run_id = client.submit(APP, "token-completed")
    assert client.find_run("token-completed") == run_id
    assert client.submit(APP, "token-completed") == run_id  # a re-sent submit

    status = finished(client, run_id)
    assert status.state is RunState.COMPLETED, status
    assert run_id not in client.live_runs()
    assert [str(run.run_id) for run in runs_with_token(flower, "token-completed")] == [run_id]
    assert client.find_run("token-never-used") is None
    assert client.abort(run_id).outcome is AbortOutcome.ALREADY_FINISHED


def test_the_jobs_sites_and_resource_spec_reach_the_server_apps_run_config(
    flower: FlowerSystem, make_client: Callable[..., FlowerControlClient], tmp_path: Path
) -> None:
    spec = {"site-1": {"num_of_gpus": 1, "mem_per_gpu_in_GiB": 8}}
    app = app_variant(
        tmp_path,
        "sites",
        **{"expect-sites": '["site-1", "site-2"]', "expect-resource-spec": json.dumps(spec)},
    )
    client = make_client(flower)
    run_id = client.submit(
        app, "token-sites", required_sites=("site-1", "site-2"), resource_spec=spec
    )
    [run] = runs_with_token(flower, "token-sites")  # on the run's record, as `flwr ls` shows
    config = {key: value.string for key, value in run.override_config.items()}
    assert json.loads(config[fab.SITES_KEY]) == ["site-1", "site-2"]
    assert json.loads(config[fab.RESOURCE_SPEC_KEY]) == spec
    status = finished(client, run_id)  # the ServerApp read both in its run config, or failed
    assert status.state is RunState.COMPLETED, status


def test_a_failing_server_app_is_failed(
    flower: FlowerSystem, make_client: Callable[..., FlowerControlClient], tmp_path: Path
) -> None:
    client = make_client(flower)
    run_id = client.submit(app_variant(tmp_path, "failing", fail=True), "token-failing")
    status = finished(client, run_id)
    assert status.state is RunState.FAILED, status
    assert "failing as its run config asks" in status.detail


def test_abort_stops_a_running_run(
    flower: FlowerSystem, make_client: Callable[..., FlowerControlClient], long_app: Path
) -> None:
    client = make_client(flower)
    run_id = client.submit(long_app, "token-aborted")
    running(client, run_id)
    assert run_id in client.live_runs()

    result = client.abort(run_id)
    assert result.outcome is AbortOutcome.ABORTED, result
    assert client.job_status(run_id).state is RunState.ABORTED
    assert run_id not in client.live_runs()
    assert client.abort(run_id).outcome is AbortOutcome.ALREADY_FINISHED
    assert client.abort("123").outcome is AbortOutcome.NOTHING_TO_ABORT  # unknown run


def test_a_run_stopped_before_it_ran_never_runs(
    flower: FlowerSystem, make_client: Callable[..., FlowerControlClient], long_app: Path
) -> None:
    """Flower's stop is final (no ABORTED_BEFORE_START as with NVFLARE): a run stopped
    while pending is never started, even after a later run has gone all the way through."""
    client = make_client(flower)
    run_id = client.submit(long_app, "token-stopped-early")
    result = client.abort(run_id)
    assert result.outcome is AbortOutcome.ABORTED, result

    later = client.submit(APP, "token-after-the-stopped-one")
    assert finished(client, later).state is RunState.COMPLETED
    status = client.job_status(run_id)
    assert (status.state, status.started_at) == (RunState.ABORTED, None)
    assert runs_with_token(flower, "token-stopped-early")[0].running_at == ""


def test_abort_with_the_superlink_down_is_nothing_to_abort(
    flower: FlowerSystem, make_client: Callable[..., FlowerControlClient], long_app: Path
) -> None:
    client = make_client(flower)
    run_id = client.submit(long_app, "token-down")
    flower.stop_superlink()

    result = client.abort(run_id)
    assert result.outcome is AbortOutcome.NOTHING_TO_ABORT, result
    assert not client.connected
    with pytest.raises(ServerUnavailable):
        client.server_start_time()
    with pytest.raises(ServerUnavailable):
        client.job_status(run_id)


def test_an_in_memory_superlink_restarted_under_a_run_forgets_it(
    flower: FlowerSystem, make_client: Callable[..., FlowerControlClient], long_app: Path
) -> None:
    client = make_client(flower)
    run_id = client.submit(long_app, "token-restart-memory")
    running(client, run_id)

    flower.kill_superlink()
    flower.ensure()

    with pytest.raises(NvflareJobNotFound):
        client.job_status(run_id)
    assert client.live_runs() == frozenset()
    assert client.find_run("token-restart-memory") is None


def test_a_superlink_with_a_state_database_restarted_under_a_run_loses_it(
    flower_system_db: FlowerSystem, make_client: Callable[..., FlowerControlClient], long_app: Path
) -> None:
    """The run's record survives, its ServerApp does not: finished:failed without the
    ServerApp's verdict, LOST (requeued by LOST_JOB_POLICY), never FAILED or still running."""
    system = flower_system_db
    system.ensure()
    client = make_client(system)
    run_id = client.submit(long_app, "token-restart-db")
    running(client, run_id)

    system.kill_superlink()
    system.ensure()  # the registrations and the run's record are in the database

    assert client.find_run("token-restart-db") == run_id
    status = finished(client, run_id)
    assert status.state is RunState.LOST, status
    assert run_id not in client.live_runs()


class _LosingProxy(http.server.ThreadingHTTPServer):
    """Forwards the Control API to the SuperLink, but cuts the connection instead of
    answering the first start-run: the run is started, its reply lost on the way back."""

    daemon_threads = True

    def __init__(self, system: FlowerSystem) -> None:
        super().__init__(("127.0.0.1", 0), _LosingHandler)
        self.upstream = system.address
        self.verify = system.tls.context()
        self.lost = 0


class _LosingHandler(http.server.BaseHTTPRequestHandler):
    server: _LosingProxy

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        answer = httpx.post(
            f"https://{self.server.upstream}{self.path}",
            content=body,
            headers={"content-type": self.headers.get("content-type", "")},
            timeout=30,
            verify=self.server.verify,
        )
        if self.path.endswith("/start-run") and self.server.lost == 0:
            self.server.lost += 1
            self.close_connection = True
            return  # no reply at all: the client sees the connection closed
        self.send_response(answer.status_code)
        self.send_header("content-type", answer.headers.get("content-type", ""))
        self.send_header("content-length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_a_lost_submit_reply_finds_the_run_again_and_starts_none(
    flower: FlowerSystem, make_client: Callable[..., FlowerControlClient]
) -> None:
    proxy = _LosingProxy(flower)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    # Plain HTTP to the proxy on loopback (it holds no certificate); TLS from it upstream.
    client = FlowerControlClient(
        net_name="flower-test", address=f"127.0.0.1:{proxy.server_address[1]}", insecure=True
    )
    try:
        with pytest.raises(ServerUnavailable):
            client.submit(APP, "token-lost-reply")
        assert proxy.lost == 1

        found = client.find_run("token-lost-reply")
        assert found is not None
        assert client.submit(APP, "token-lost-reply") == found  # the retry adopts it
        assert [str(run.run_id) for run in runs_with_token(flower, "token-lost-reply")] == [found]
        assert finished(client, found).state is RunState.COMPLETED
    finally:
        client.close()
        proxy.shutdown()
        proxy.server_close()


def test_a_submit_paused_past_another_start_of_its_token_keeps_the_first_run(
    flower: FlowerSystem,
    make_client: Callable[..., FlowerControlClient],
    long_app: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Simulation seed 561: a worker looked the token up (no run), paused, and a retry of
    the same attempt started the run meanwhile; the paused worker's start-run then starts a
    second one. Its re-check finds the first, stops its own while still pending (a stop is
    final: it never runs) and answers the first, as every racer does."""
    client = make_client(flower)
    first = client.submit(long_app, "token-paused")
    late = make_client(flower)
    monkeypatch.setattr(late, "find_run", lambda _token: None)  # its lookup came before
    assert late.submit(long_app, "token-paused") == first
    assert client.find_run("token-paused") == first  # a re-sent submit adopts it too
    runs = runs_with_token(flower, "token-paused")
    assert len(runs) == 2
    second = next(run for run in runs if str(run.run_id) != first)
    status = client.job_status(str(second.run_id))
    assert (status.state, status.started_at) == (RunState.ABORTED, None)
    assert client.abort(first).outcome is AbortOutcome.ABORTED
    assert second.running_at == ""

"""The NVFLARE admin client against a REAL server that is really stopped, killed and started.

No part of the nvflare connection is mocked: every "server down" here is a process that is
gone, every "wrong kit" a kit of another project or CA. The independent yardstick is a raw
nvflare session made directly with nvflare's own API (`tests.fixtures.nvflare.raw_session`).

Tests that restart the server share the session's two sites, which keep running and
re-register by themselves; tests are ordered so that waits for re-registration are few.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from app import process_control
from app.adapters.backend import AbortOutcome, Readiness, RunState, ServerState
from app.adapters.nvflare import classify as nvflare_classify
from app.adapters.nvflare.client import NvflareAdminClient, build_admin_client
from app.errors import AdminMisconfigured, ServerUnavailable, TransientError
from app.local.nvflare import Deployment
from tests.fixtures.nvflare import (
    NvflareSystem,
    admin_settings,
    kit_processes,
    net_config,
    poll,
    raw_session,
)

pytestmark = [pytest.mark.integration, pytest.mark.nvflare]

EXPECTED_S = 120  # seconds on the 2-core CI machine (tests/tools/schedule.py)

JOB_TIMEOUT_S = 180.0  # measured ~15 s for the tiny job on 2 cores


@pytest.fixture
def make_client(nvflare_deployment: Deployment) -> Iterator[Callable[..., NvflareAdminClient]]:
    """Admin clients built the production way (`build_admin_client`); all closed after."""
    clients: list[NvflareAdminClient] = []

    def make(
        kit: Path | None = None,
        *,
        username: str | None = None,
        ready_timeout_s: float = 900.0,
        **settings: Any,
    ) -> NvflareAdminClient:
        net = net_config(nvflare_deployment, kit, username, ready_timeout_s=ready_timeout_s)
        client = build_admin_client(net, admin_settings(**settings))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def _job_ids(deployment: Deployment) -> set[str]:
    session = raw_session(deployment, timeout=5.0)
    assert session is not None, "raw login failed"
    try:
        return {job["job_id"] for job in session.list_jobs()}
    finally:
        session.close()


def _raw(client: NvflareAdminClient, job_id: str) -> str:
    """The server's own status word, as the adapter reports it beside its mapping."""
    return client.job_status(job_id).detail.removeprefix("NVFLARE ")


def _wait_status(client: NvflareAdminClient, job_id: str, done: Callable[[str], bool]) -> str:
    return str(
        poll(
            f"job {job_id}",
            lambda: status if done(status := _raw(client, job_id)) else None,
            JOB_TIMEOUT_S,
            0.5,
        )
    )


# --- 1-3: the moment the server comes back ---------------------------------------------------


def test_boot_with_server_down_then_the_first_command_after_start_succeeds(
    nvflare_server_down: NvflareSystem, make_client: Callable[..., NvflareAdminClient]
) -> None:
    client = make_client()

    # Nothing escapes for "down": state and readiness answer, abort finds nothing to do.
    assert client.server_state() is ServerState.UNREACHABLE
    readiness = client.is_ready(["site-1", "site-2"])
    assert not readiness.ready
    assert readiness.server_state is ServerState.UNREACHABLE
    assert client.abort("no-such-job").outcome is AbortOutcome.NOTHING_TO_ABORT
    with pytest.raises(ServerUnavailable):
        client.ping()  # a command raises, but only the classified transient error
    assert not client.connected

    nvflare_server_down.start_server()
    nvflare_server_down.wait_login()  # a raw nvflare login works: the server is back

    client.ping()  # the very first command after that succeeds
    assert client.connected
    assert client.server_state() is ServerState.STARTED


@pytest.mark.parametrize("command_while_down", [True, False], ids=["used-while-down", "idle"])
def test_stopped_server_drops_the_session_and_the_restarted_one_gets_a_new_session(
    nvflare_server: NvflareSystem,
    make_client: Callable[..., NvflareAdminClient],
    command_while_down: bool,
) -> None:
    client = make_client()
    client.ping()
    assert client.connected
    first = client.session
    assert first is not None

    nvflare_server.stop_server()
    if command_while_down:
        with pytest.raises(ServerUnavailable):
            client.ping()
        assert not client.connected  # not latched by the earlier success
        assert client.session is None
        assert first.api.closed  # the dropped session was closed, not leaked

    nvflare_server.start_server()
    nvflare_server.wait_login()
    # Succeeds at once, also when the old session was still held: that one fails (nvflare's
    # own recovery takes 20-30 s) and the command goes through on a fresh session.
    client.ping()
    assert client.connected
    assert client.session is not None
    if client.session is not first:
        assert first.api.closed  # replaced by a fresh session, the old one closed, not leaked
    else:
        # Only a session that was never used while the server was down can still be the same
        # one: nvflare's own reconnect revived it (20-30 s after the restart, reached when the
        # restart itself is slow on a loaded machine), and it just answered a command.
        assert not command_while_down


# Each stock login runs in a thread of its own, and one that has not returned after
# PROBE_TRY_S is left behind while the next starts: a stock login can hang well past its own
# timeout on a loaded machine (seen once with four test workers: no login for 60 s while the
# client was in after 4 s), and a yardstick stuck in one call measures nothing.
_RAW_PROBE = """
import sys, threading, time
from pathlib import Path
from nvflare.fuel.flare_api.flare_api import new_secure_session

user, kit, ready, result, try_s = sys.argv[1:6]
got_in = threading.Lock()

def attempt():
    try:
        session = new_secure_session(user, kit, timeout=1.0, auto_login_max_tries=1)
    except Exception:
        return
    if got_in.acquire(blocking=False):
        Path(result).write_text(repr(time.monotonic()))  # CLOCK_MONOTONIC: one per machine
    session.close()

Path(ready).touch()
while not Path(result).exists():
    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(float(try_s))
"""
PROBE_TRY_S = 3.0


def test_cold_start_every_error_is_transient_and_first_success_follows_the_first_possible_login(
    nvflare_server_down: NvflareSystem,
    make_client: Callable[..., NvflareAdminClient],
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Poll from the moment the process starts. The yardstick is an independent loop of raw
    nvflare logins, in a process of its own running stock nvflare (1 s timeout each, back to
    back): the first moment it gets in is the first moment a fresh login can succeed."""
    deployment = nvflare_server_down.deployment
    client = make_client()
    unknown_before = sum(nvflare_classify.unknown_errors.values())
    ready, result = tmp_path / "probe-ready", tmp_path / "probe-result"
    argv = [
        deployment.admin_user,
        str(deployment.admin_kit),
        str(ready),
        str(result),
        str(PROBE_TRY_S),
    ]
    prober = subprocess.Popen(
        [sys.executable, "-c", _RAW_PROBE, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    errors: list[TransientError] = []
    client_first = None
    try:
        poll("the raw probe to import nvflare", ready.exists, 60, 0.05)
        launched = time.monotonic()
        nvflare_server_down.start_server()
        while time.monotonic() - launched < 60:
            try:
                client.ping()  # anything but a TransientError escapes and fails the test
            except TransientError as exc:
                errors.append(exc)
                time.sleep(0.1)
                continue
            client_first = time.monotonic()
            break
        # Its first login, not its exit: a stock session may be slow to close.
        poll("the raw probe's first login", result.exists, 60, 0.05)
    finally:
        process_control.terminate_tree(prober.pid, sig=signal.SIGKILL)
        prober.wait(timeout=10)

    assert client_first is not None, "the client never got through"
    probe_first = float(result.read_text())
    assert errors, "the client got through at once: the cold-start window was not exercised"
    assert all(isinstance(e, ServerUnavailable) for e in errors), {type(e) for e in errors}
    assert sum(nvflare_classify.unknown_errors.values()) == unknown_before
    lag = client_first - probe_first
    record_property("cold_start_probe_first_login_s", round(probe_first - launched, 2))
    record_property("cold_start_client_first_success_s", round(client_first - launched, 2))
    # Measured on 2 cores: the client gets in 0.2 s before to 0.05 s after the stock loop
    # (both wait for the server to accept logins, ~2 s after its port opens); 1.1 s on a
    # machine running four other test sessions. What the bound tells apart is the failure it
    # guards against: a plain 10 s login started before the port opened lands ~10 s late. So
    # it is half of that, not a speed target (the lag is recorded above).
    assert lag <= 5.0, f"client first success {lag:.2f} s after the first possible login"


_FORGETFUL_PROCESS = """
import sys
from pathlib import Path
from app.adapters.nvflare.client import NvflareAdminClient

client = NvflareAdminClient(
    net_name="n", kit_dir=Path(sys.argv[1]), username=sys.argv[2], login_timeout_s=5.0,
    command_timeout_s=5.0, login_max_tries=1, misconfigured_after_s=60.0,
)
client.ping()
assert client.connected
# no client.close(): the process must exit anyway
"""


def test_a_process_that_never_closes_its_client_still_exits_promptly(
    nvflare_server: NvflareSystem,
) -> None:
    """An open nvflare session keeps its executor threads alive: without the exit hook this
    process was still running after 120 s. It must exit by itself (measured ~3.5 s, most of
    it imports and login; the timeout, far above that and below 120 s, tells the two apart
    on a loaded machine too: a 30 s bound failed at 38 s under a load of 13)."""
    deployment = nvflare_server.deployment
    process = subprocess.run(
        [
            sys.executable,
            "-c",
            _FORGETFUL_PROCESS,
            str(deployment.admin_kit),
            deployment.admin_user,
        ],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        timeout=90,  # subprocess.TimeoutExpired: still running, the hook gone
        check=False,
    )
    assert process.returncode == 0, process.stderr.decode()[-2000:]


# --- 4: a wrong kit is misconfiguration, never "server down" ---------------------------------


def _copy_kit(src: Path, dest: Path, **admin_changes: Any) -> Path:
    shutil.copytree(src, dest)
    config_path = dest / "startup" / "fed_admin.json"
    config = json.loads(config_path.read_text())
    config["admin"].update(admin_changes)
    config_path.write_text(json.dumps(config))
    return dest


def _poll_readiness_until_misconfigured(
    client: NvflareAdminClient, deadline_s: float
) -> tuple[float, list[Readiness], AdminMisconfigured]:
    """What wait_ready does: poll is_ready until the deadline; AdminMisconfigured must end it."""
    seen: list[Readiness] = []
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        try:
            seen.append(client.is_ready(["site-1", "site-2"]))
        except AdminMisconfigured as exc:
            return time.monotonic() - started, seen, exc
        time.sleep(0.2)
    raise AssertionError(f"no AdminMisconfigured within {deadline_s} s; saw {seen}")


@pytest.fixture
def wrong_kits(
    tmp_path: Path, nvflare_deployment: Deployment, other_deployment: Deployment
) -> dict[str, Path]:
    ours, other = nvflare_deployment.admin_kit, other_deployment.admin_kit
    wrong_ca = shutil.copytree(ours, tmp_path / "wrong-ca")
    shutil.copy(other / "startup" / "rootCA.pem", wrong_ca / "startup" / "rootCA.pem")
    return {
        # A complete, consistent kit of another project (another CA) dialling our server.
        "other-project": other,
        # Our certificate and key, but another CA's rootCA.pem.
        "wrong-ca": wrong_ca,
        # Our kit expecting a server of another name.
        "wrong-identity": _copy_kit(ours, tmp_path / "identity", server_identity="other"),
        # Our kit claiming another project: the server rejects the registration (~6 s).
        "wrong-project": _copy_kit(ours, tmp_path / "project", project_name="other-project"),
    }


@pytest.mark.parametrize(
    "variant", ["other-project", "wrong-ca", "wrong-identity", "wrong-project"]
)
def test_wrong_admin_kit_is_misconfigured_within_the_readiness_deadline(
    nvflare_server: NvflareSystem,
    make_client: Callable[..., NvflareAdminClient],
    wrong_kits: dict[str, Path],
    variant: str,
) -> None:
    deadline_s = 30.0
    client = make_client(wrong_kits[variant], ready_timeout_s=deadline_s)

    elapsed, seen, error = _poll_readiness_until_misconfigured(client, deadline_s)

    assert elapsed < deadline_s
    assert not any(r.server_state is ServerState.UNREACHABLE for r in seen), seen
    assert str(wrong_kits[variant]) in str(error)
    assert not client.connected
    # The same kit never gets reported as a down server by server_state either.
    with pytest.raises(AdminMisconfigured):
        client.server_state()


def test_a_username_that_is_not_the_kits_user_is_misconfigured_at_once(
    nvflare_server: NvflareSystem, make_client: Callable[..., NvflareAdminClient]
) -> None:
    """nvflare itself rejects it as "error:client_registration no registration session"."""
    client = make_client(username="someone-else@nvidia.com")

    with pytest.raises(AdminMisconfigured, match="is not the kit's user"):
        client.is_ready(["site-1"])
    assert client.session is None and client.sessions_created == 0


class _FakeTlsServer:
    """A port that completes TLS with the real server certificate (right CA, right identity)
    but is no NVFLARE server: it answers every request with a 404, or never answers."""

    def __init__(self, server_kit: Path, *, answer_http: bool) -> None:
        self._answer_http = answer_http
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        startup = server_kit / "startup"
        self._context.load_cert_chain(startup / "server.crt", startup / "server.key")
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            try:
                conn.settimeout(2)
                tls = self._context.wrap_socket(conn, server_side=True)
                if self._answer_http:
                    tls.recv(4096)
                    tls.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    tls.close()
                else:
                    self._open.append(tls)  # held open, never answered
            except (OSError, ssl.SSLError):
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        for conn in self._open:
            conn.close()


@pytest.mark.parametrize("answer_http", [True, False], ids=["answers-404", "never-answers"])
def test_port_with_the_right_certificate_that_never_logs_us_in_is_misconfigured_at_the_deadline(
    tmp_path: Path,
    nvflare_deployment: Deployment,
    make_client: Callable[..., NvflareAdminClient],
    answer_http: bool,
) -> None:
    """The certificate checks pass, yet no login ever works: not a server that is down. Each
    attempt stays bounded (nvflare alone would hang 300 s on the silent port), and past the
    net's readiness deadline it is reported as a misconfiguration."""
    fake = _FakeTlsServer(nvflare_deployment.server_kit, answer_http=answer_http)
    try:
        kit = _copy_kit(nvflare_deployment.admin_kit, tmp_path / "kit", port=fake.port)
        deadline_s = 4.0
        client = make_client(kit, ready_timeout_s=deadline_s, ADMIN_LOGIN_TIMEOUT_S=1.0)

        elapsed, seen, error = _poll_readiness_until_misconfigured(client, 4 * deadline_s)
    finally:
        fake.close()

    assert deadline_s <= elapsed < 3 * deadline_s
    assert seen and all(r.server_state is ServerState.STARTING for r in seen), seen
    assert "never let this admin kit log in" in str(error)


# --- 5-6: jobs ---------------------------------------------------------------------------


def test_readiness_reuses_a_live_session_and_replaces_it_when_it_failed(
    nvflare_sites: NvflareSystem, make_client: Callable[..., NvflareAdminClient]
) -> None:
    """A readiness poll asks the live session instead of logging in again (the login was
    most of a warm dispatch's readiness time); a session that fails is dropped, closed and
    replaced by a fresh login within the same poll, which still says ready."""
    sites = ["site-1", "site-2"]
    client = make_client()
    first_check = client.is_ready(sites)
    assert first_check.ready
    first = client.session
    assert first is not None and client.sessions_created == 1

    for _ in range(3):
        again = client.is_ready(sites)
        assert again.ready
        assert again.server_start_time == first_check.server_start_time
    assert client.session is first and client.sessions_created == 1  # no new login

    # What nvflare does to a session the server expired (1800 s idle): every command on it
    # raises SessionExpired from then on.
    first.api.session_expired_reason = "session expired (set by the test)"
    replaced = client.is_ready(sites)
    assert replaced.ready, replaced
    assert client.session is not None and client.session is not first
    assert client.sessions_created == 2
    assert first.api.closed  # the failed session was closed, not leaked


def test_submit_runs_the_tiny_job_to_completion_and_a_repeated_token_makes_one_job(
    nvflare_sites: NvflareSystem,
    make_client: Callable[..., NvflareAdminClient],
    tiny_job: Path,
    long_job: Path,
    record_property: Callable[[str, object], None],
) -> None:
    deployment = nvflare_sites.deployment
    client = make_client()
    before = _job_ids(deployment)
    token = str(uuid.uuid4())

    submitted = time.monotonic()
    job_id = client.submit(tiny_job, submit_token=token)
    assert client.submit(tiny_job, submit_token=token) == job_id  # a retry of the same submit
    # Same token, other content (e.g. the folder changed between attempts): still that job.
    assert client.submit(long_job, submit_token=token) == job_id
    assert _job_ids(deployment) - before == {job_id}

    status = _wait_status(client, job_id, lambda s: s.startswith("FINISHED"))
    record_property("tiny_job_submit_to_finished_s", round(time.monotonic() - submitted, 1))
    assert status == "FINISHED:COMPLETED"
    assert client.job_status(job_id).state is RunState.COMPLETED
    assert _job_ids(deployment) - before == {job_id}


def test_abort_outcomes_running_finished_unknown_and_server_down(
    nvflare_sites: NvflareSystem,
    make_client: Callable[..., NvflareAdminClient],
    long_job: Path,
) -> None:
    client = make_client()
    job_id = client.submit(long_job, submit_token=str(uuid.uuid4()))
    _wait_status(client, job_id, lambda s: s == "RUNNING")

    assert client.abort(job_id).outcome is AbortOutcome.ABORTED
    assert _wait_status(client, job_id, lambda s: s.startswith("FINISHED")) == "FINISHED:ABORTED"
    assert not client.job_status(job_id).unstarted  # it ran: its job store has a start time

    finished = client.abort(job_id)
    assert finished.outcome is AbortOutcome.ALREADY_FINISHED
    assert finished.detail == "FINISHED:ABORTED"
    assert client.abort(str(uuid.uuid4())).outcome is AbortOutcome.NOTHING_TO_ABORT

    nvflare_sites.stop_server()
    down = client.abort(job_id)
    assert down.outcome is AbortOutcome.NOTHING_TO_ABORT
    assert "unavailable" in down.detail
    assert not client.connected


def test_an_abort_while_the_job_runner_starts_the_run_does_not_stop_it(
    nvflare_sites: NvflareSystem,
    make_client: Callable[..., NvflareAdminClient],
    long_job: Path,
) -> None:
    """nvflare 2.9 answers the abort of a DISPATCHED job (its job runner is starting it)
    "aborted before running it" and marks it FINISHED:ABORTED; the runner, unless it checked
    the status after the mark, then sets the run RUNNING over it and runs it. The client says
    ABORTED_BEFORE_START whenever the run had not started, which the dispatcher never takes
    for proof the run is over (app.usecases.abort.settle_after). The race is the server's:
    measured here, the mark was overwritten in 4 tries of 5; so a few tries, one must show it.
    (In CI, once, the run started between the test's status read and the client's own.)
    """
    client = make_client()
    for _ in range(RACE_TRIES):
        job_id = client.submit(long_job, submit_token=str(uuid.uuid4()))
        seen = poll(
            "the run DISPATCHED or RUNNING",
            partial(_started_or_starting, client, job_id),
            JOB_TIMEOUT_S,
            0.01,
        )
        answer = client.abort(job_id)
        # The client reads the status again before its abort: a run started meanwhile gets
        # an ordinary abort (ABORTED), one still DISPATCHED is ABORTED_BEFORE_START, never
        # proof, whatever the server then answered ("Abort signal has been sent" too).
        if seen == "DISPATCHED" and answer.outcome is AbortOutcome.ABORTED_BEFORE_START:
            if _overwritten(client, job_id):
                break
        else:
            assert answer.outcome is AbortOutcome.ABORTED, answer
        _wait_status(client, job_id, lambda s: s.startswith("FINISHED"))
    else:
        pytest.fail(f"no abort of a DISPATCHED run was overwritten in {RACE_TRIES} tries")
    # The run goes on, RUNNING, in a process of the server's; only an abort now stops it.
    poll("the run listed", lambda: job_id in client.live_runs() or None, 30, 0.2)
    assert client.abort(job_id).outcome is AbortOutcome.ABORTED
    assert _wait_status(client, job_id, lambda s: s.startswith("FINISHED")) == "FINISHED:ABORTED"


def test_a_job_aborted_before_it_started_reads_aborted_with_no_start_time(
    nvflare_sites: NvflareSystem,
    make_client: Callable[..., NvflareAdminClient],
    long_job: Path,
    tmp_path: Path,
) -> None:
    """A job the server cannot schedule (it wants more sites than are connected) stays
    SUBMITTED; its abort is answered "before running it", and its FINISHED:ABORTED has no
    start time: the `unstarted` mark the dispatcher holds a stray run for (an abort whose
    answer was lost leaves only that mark to read)."""
    waiting = tmp_path / "waiting-fedavg"
    shutil.copytree(long_job, waiting)
    meta = json.loads((waiting / "meta.json").read_text())
    meta.update(name="waiting-fedavg", min_clients=len(nvflare_sites.deployment.site_kits) + 1)
    (waiting / "meta.json").write_text(json.dumps(meta))
    client = make_client()
    job_id = client.submit(waiting, submit_token=str(uuid.uuid4()))
    assert _raw(client, job_id) == "SUBMITTED"
    answer = client.abort(job_id)
    assert answer.outcome is AbortOutcome.ABORTED_BEFORE_START, answer
    assert "before running it" in answer.detail
    status = client.job_status(job_id)
    assert (status.state, status.unstarted) == (RunState.ABORTED, True), status


# It stops at the first try that shows the overwrite (4 of 5 did, quiet); a loaded machine
# starts the run before the abort lands more often, so the cap is generous.
RACE_TRIES = 12


def _started_or_starting(client: NvflareAdminClient, job_id: str) -> str | None:
    status = _raw(client, job_id)
    return status if status in ("DISPATCHED", "RUNNING") else None


def _overwritten(client: NvflareAdminClient, job_id: str) -> bool:
    """The run reads RUNNING within 10 s of an abort that marked it FINISHED:ABORTED (the
    runner's start takes 1-3 s here)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _raw(client, job_id) == "RUNNING":
            return True
        time.sleep(0.2)
    return False


# --- 7-8: the server lost mid-job, and readiness after a restart ----------------------------


def test_server_killed_mid_job_and_restarted_has_a_new_start_time(
    nvflare_sites: NvflareSystem,
    make_client: Callable[..., NvflareAdminClient],
    long_job: Path,
) -> None:
    client = make_client()
    token = str(uuid.uuid4())
    job_id = client.submit(long_job, submit_token=token)
    _wait_status(client, job_id, lambda s: s == "RUNNING")
    before = client.server_start_time()
    # The server process lists the run it runs (check_status server's job table).
    poll("the run listed", lambda: job_id in client.live_runs() or None, 30, 0.2)
    # The job store's start time of a run: after that of the process that runs it.
    live = client.job_status(job_id)
    assert live.started_at is not None and live.started_at > before, (live, before)

    server_tree = kit_processes(nvflare_sites.deployment.server_kit)
    assert len(server_tree) >= 2, "the job's server process should be running"
    nvflare_sites.kill_server()
    # The crash takes the job's server process too (nvflare runs it in a session of its own).
    assert not kit_processes(nvflare_sites.deployment.server_kit)
    assert client.server_state() is ServerState.UNREACHABLE
    nvflare_sites.start_server()

    def start_time() -> float | None:
        try:
            return client.server_start_time()
        except TransientError:
            return None

    after = poll("the restarted server's start time", start_time, 60, 0.2)
    assert after > before  # this is how the dispatcher notices the restart

    # nvflare 2.9 keeps the lost job's record as RUNNING after a restart, though nothing runs
    # it; the server refuses to abort it ("is not running"): the one answer that says the
    # run is over (the dispatcher settles its stray on it), and the record still reads RUNNING.
    dead = client.job_status(job_id)
    assert dead.state is RunState.RUNNING
    assert job_id not in client.live_runs()  # what tells it from a run this process runs
    # So does its start time, the same as before the crash: before this process started.
    assert dead.started_at == live.started_at and dead.started_at < after
    # A re-sent submit with the run's token is answered with the dead run: the dispatcher
    # would adopt it with this process's start time (app.usecases.monitor._started_before).
    assert client.submit(long_job, submit_token=token) == job_id
    refused = client.abort(job_id)
    assert refused.outcome is AbortOutcome.NOT_RUNNING, refused
    assert client.job_status(job_id).state is RunState.RUNNING


def test_readiness_waits_for_both_sites_to_re_register_after_a_restart(
    nvflare_sites: NvflareSystem,
    make_client: Callable[..., NvflareAdminClient],
    record_property: Callable[[str, object], None],
) -> None:
    sites = ["site-1", "site-2"]
    client = make_client()
    first = client.is_ready(sites)
    assert first.ready

    nvflare_sites.stop_server()
    nvflare_sites.start_server()
    restarted = time.monotonic()
    seen: list[Readiness] = []
    answered_at = None
    while time.monotonic() - restarted < 90:
        seen.append(client.is_ready(sites))
        if answered_at is None and seen[-1].server_state is ServerState.STARTED:
            answered_at = time.monotonic()
        if seen[-1].ready:
            break
        time.sleep(0.2)
    ready = seen[-1]
    if answered_at is not None:
        record_property("server_login_after_restart_s", round(answered_at - restarted, 1))
    record_property("sites_reregistered_after_restart_s", round(time.monotonic() - restarted, 1))

    assert ready.ready, seen[-3:]
    assert not any(r.ready for r in seen[:-1])
    # The gate held: the server answered while a site was still missing, and said not ready.
    waiting = [r for r in seen if r.server_state is ServerState.STARTED and not r.ready]
    assert waiting, "the sites re-registered before the server answered: gate not exercised"
    assert all(r.missing_sites for r in waiting)
    assert set(sites) <= set(ready.connected_sites)
    # The server's own view agrees (a fresh raw session's check_status, polled: one probe's
    # 1 s login can miss under a loaded run, and then reads as no site at all). A few probes,
    # not an "eventually": the sites must be registered already, not within a re-registration.
    nvflare_sites.wait_sites(sites, timeout=8)
    assert ready.server_start_time is not None and first.server_start_time is not None
    assert ready.server_start_time > first.server_start_time

"""The Flower backend's pure parts: the FAB it builds (the submit token's config key
declared, flwr's file rules, a manifest the SuperExec can check), Flower run states and
Control API failures in the dispatcher's words. What a real SuperLink makes of them is
tests/integration/test_flower_backend.py's."""

from __future__ import annotations

import hashlib
import http.server
import io
import socketserver
import ssl
import threading
import tomllib
import zipfile
from pathlib import Path

import httpx
import pytest

from app.adapters.backend import AbortOutcome, RunState
from app.adapters.flower import classify, fab
from app.adapters.flower.client import FlowerControlClient
from app.errors import (
    AdminMisconfigured,
    InvalidRequest,
    NvflareJobNotFound,
    NvflareJobNotRunning,
    ServerUnavailable,
    UnknownAdminError,
)

APP_HEAD = """[project]
name = "demo"
version = "1.0.0"

[tool.flwr.app]
publisher = "me"

[tool.flwr.app.components]
serverapp = "demo.server:app"
clientapp = "demo.client:app"
"""


def config_of(text: str) -> dict[str, object]:
    return tomllib.loads(text)["tool"]["flwr"]["app"]["config"]  # type: ignore[no-any-return]


KEYS = dict.fromkeys(fab.DISPATCHER_KEYS, "")  # the submit token, the job's sites and spec


def test_the_dispatchers_keys_go_under_the_apps_config_table() -> None:
    text = APP_HEAD + "\n[tool.flwr.app.config]  # the run config\nnum-rounds = 3\n\n[x]\ny = 1\n"
    changed = fab.declare_keys(text)
    assert config_of(changed) == {"num-rounds": 3, **KEYS}
    assert tomllib.loads(changed)["x"] == {"y": 1}


def test_an_app_without_a_config_gets_one_with_the_keys() -> None:
    assert config_of(fab.declare_keys(APP_HEAD.rstrip("\n"))) == KEYS


def test_keys_already_declared_leave_the_text_as_it_is_and_the_others_are_added() -> None:
    text = APP_HEAD + "\n[tool.flwr.app.config]\n" + "".join(f'{k} = ""\n' for k in KEYS)
    assert fab.declare_keys(text) == text
    one = APP_HEAD + f'\n[tool.flwr.app.config]\n{fab.SITES_KEY} = "[]"\n'
    assert config_of(fab.declare_keys(one)) == {**KEYS, fab.SITES_KEY: "[]"}


@pytest.mark.parametrize(
    "config",
    [
        "config = { num-rounds = 3 }",  # an inline table: a line cannot be added to it
        "config.num-rounds = 3",  # dotted keys: a [tool.flwr.app.config] header is an error
    ],
)
def test_a_config_the_key_cannot_be_added_to_is_refused(config: str) -> None:
    text = APP_HEAD.replace('publisher = "me"', f'publisher = "me"\n{config}')
    assert "num-rounds" in str(tomllib.loads(text))
    with pytest.raises(InvalidRequest, match="cannot declare the run config keys"):
        fab.declare_keys(text)


def test_what_is_no_flower_app_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match=r"holds no pyproject\.toml"):
        fab.build_fab(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(InvalidRequest, match=r"no \[tool\.flwr\.app\.components\]"):
        fab.build_fab(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project\n")
    with pytest.raises(InvalidRequest, match="not valid TOML"):
        fab.build_fab(tmp_path)
    with_include = APP_HEAD.replace('publisher = "me"', 'publisher = "me"\nfab-include = ["*.py"]')
    (tmp_path / "pyproject.toml").write_text(with_include)
    with pytest.raises(InvalidRequest, match="fab-include is not supported"):
        fab.build_fab(tmp_path)


def write_app(folder: Path) -> None:
    files = {
        "pyproject.toml": APP_HEAD,
        "demo/__init__.py": "",
        "demo/server.py": "app = 1\n",
        "demo/client.py": "app = 2\n",
        "demo/settings.yaml": "a: 1\n",
        "LICENSE": "Apache-2.0\n",
        "README.md": "# demo\n",
        # What flwr leaves out of a FAB:
        "demo/test_server.py": "",
        "demo/server_test.py": "",
        "demo/__pycache__/server.cpython-311.pyc": "",
        ".venv/lib/x.py": "",
        "build/demo/server.py": "",
        "weights.bin": "0",
        "data/notes.txt": "",
    }
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(content)


def test_the_fab_holds_flwrs_files_a_manifest_and_the_same_bytes_each_time(
    tmp_path: Path,
) -> None:
    write_app(tmp_path)
    bundle = fab.build_fab(tmp_path)
    assert fab.build_fab(tmp_path) == bundle  # one folder, one FAB hash
    assert fab.fab_hash(bundle) == hashlib.sha256(bundle).hexdigest()

    with zipfile.ZipFile(io.BytesIO(bundle)) as archive:
        names = archive.namelist()
        assert names == [
            "pyproject.toml",
            "LICENSE",
            "README.md",
            "demo/__init__.py",
            "demo/client.py",
            "demo/server.py",
            "demo/settings.yaml",
            ".info/CONTENT",
        ]
        assert config_of(archive.read("pyproject.toml").decode()) == KEYS
        manifest = archive.read(".info/CONTENT").decode().splitlines()
        assert [line.split(",")[0] for line in manifest] == names[:-1]
        for line in manifest:
            name, digest, bits = line.split(",")
            content = archive.read(name)
            assert (digest, int(bits)) == (hashlib.sha256(content).hexdigest(), 8 * len(content))
        assert {info.date_time for info in archive.infolist()} == {fab.FAB_DATE}


def test_a_fab_over_the_superlinks_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_app(tmp_path)
    monkeypatch.setattr(fab, "FAB_MAX_BYTES", 200)
    with pytest.raises(InvalidRequest, match="over the SuperLink's 200"):
        fab.build_fab(tmp_path)


@pytest.mark.parametrize(
    ("status", "sub_status", "details", "state"),
    [
        ("pending", "", "", RunState.RUNNING),
        ("starting", "", "", RunState.RUNNING),
        ("running", "", "", RunState.RUNNING),
        ("finished", "completed", "", RunState.COMPLETED),
        ("finished", "stopped", "", RunState.ABORTED),
        ("finished", "failed", "ServerApp failed with exception: boom", RunState.FAILED),
        # No verdict of the app's: its process was cut off (a SuperLink restart) or expired.
        ("finished", "failed", "Task failed with unknown error.", RunState.LOST),
        ("finished", "failed", "Task failed because the run expired", RunState.LOST),
        ("finished", "", "", RunState.LOST),
        ("finished", "something-new", "", RunState.LOST),
    ],
)
def test_flower_run_states(status: str, sub_status: str, details: str, state: RunState) -> None:
    result = classify.run_status(status, sub_status, details)
    assert result.state is state
    assert status in result.detail and details in result.detail


def test_a_running_run_carries_when_it_went_running() -> None:
    at = "2026-12-04T08:49:39.510303+00:00"
    assert classify.run_status("running", "", "", at).started_at == 1796374179.510303
    assert classify.run_status("pending", "", "", "").started_at is None
    assert classify.run_status("finished", "completed", "", at).started_at is None


def answer(status: int, body: object = None, content: bytes = b"") -> httpx.Response:
    if body is not None:
        return httpx.Response(status, json=body)
    return httpx.Response(status, content=content)


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (answer(404, {"code": 16, "detail": "Run ID not found."}), NvflareJobNotFound),
        (answer(409, {"code": 18, "detail": "finished"}), NvflareJobNotRunning),
        (answer(400, {"code": 15, "detail": "bad config"}), InvalidRequest),
        (answer(401, {"code": 36, "detail": "no"}), AdminMisconfigured),
        (answer(403, {"code": 2, "detail": "no federation"}), AdminMisconfigured),
        (answer(400, {"code": 1003, "detail": "bad payload"}), AdminMisconfigured),
        (answer(503, content=b"<html>starting</html>"), ServerUnavailable),
        (answer(502), ServerUnavailable),
        (answer(404, content=b"Not Found"), AdminMisconfigured),  # no such route: not 1.42
        (answer(500, {"code": 14, "detail": "failed to create"}), UnknownAdminError),
        (answer(500, content=b"oops"), UnknownAdminError),
    ],
)
def test_control_api_answers_map_to_the_app_errors(
    response: httpx.Response, error: type[Exception]
) -> None:
    result = classify.classified_http_error(response, "net x")
    assert type(result) is error
    assert str(result).startswith(f"net x: HTTP {response.status_code}")


def test_an_unclassified_answer_is_counted() -> None:
    before = classify.unknown_errors["http 500 code 14"]
    classify.classified_http_error(answer(500, {"code": 14}), "net x")
    assert classify.unknown_errors["http 500 code 14"] == before + 1


def test_no_answer_is_unavailable_but_a_certificate_of_another_ca_is_misconfigured() -> None:
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    assert type(classify.classified_transport_error(refused, "net x")) is ServerUnavailable
    timeout = httpx.ReadTimeout("timed out")
    assert type(classify.classified_transport_error(timeout, "net x")) is ServerUnavailable
    wrong_ca = httpx.ConnectError("certificate verify failed")
    wrong_ca.__cause__ = ssl.SSLCertVerificationError("unable to get local issuer certificate")
    assert type(classify.classified_transport_error(wrong_ca, "net x")) is AdminMisconfigured


def test_a_client_without_tls_and_with_a_ca_is_misconfigured(tmp_path: Path) -> None:
    with pytest.raises(AdminMisconfigured, match="insecure"):
        FlowerControlClient(
            net_name="x", address="127.0.0.1:1", insecure=True, root_certificates=tmp_path
        )


def test_a_run_id_flower_cannot_have_is_an_unknown_run() -> None:
    client = FlowerControlClient(net_name="x", address="127.0.0.1:1", insecure=True)
    with pytest.raises(NvflareJobNotFound, match="no Flower run id"):
        client.job_status("not-a-number")
    assert client.abort(str(2**64)).outcome is AbortOutcome.NOTHING_TO_ABORT


class _PlainHttp(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None: ...


def test_a_superlink_without_tls_for_a_client_with_tls_is_misconfigured() -> None:
    """A SuperLink started `--insecure` while the net's client speaks TLS answers every
    handshake in plain HTTP (flwr 1.42: `[SSL: WRONG_VERSION_NUMBER]`, every time): the
    net's settings, never "SuperLink still starting" until the readiness deadline, the net
    UNHEALTHY and the job's attempt spent, again for every job."""
    server = socketserver.TCPServer(("127.0.0.1", 0), _PlainHttp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        client = FlowerControlClient(net_name="x", address=address)
        with pytest.raises(AdminMisconfigured, match="WRONG_VERSION_NUMBER"):
            client.server_state()
        with pytest.raises(AdminMisconfigured):
            client.is_ready(["site-1"])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()

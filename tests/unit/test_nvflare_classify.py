"""classify(): every nvflare 2.9 admin exception maps to one meaning, decided in one place.

The exceptions are the real nvflare classes with the messages nvflare raises (see
nvflare 2.9.0 in site-packages: fuel/flare_api/flare_api.py, fuel/hci/client/api.py,
private/fed/authenticator.py); the behaviour behind them is pinned by the integration tests.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from nvflare.apis.fl_exception import FLCommunicationError
from nvflare.fuel.common.excepts import ConfigError
from nvflare.fuel.f3.cellnet.cell_cipher import InvalidCertChain
from nvflare.fuel.flare_api import api_spec as nv

from app.adapters.nvflare import classify as nvflare_classify
from app.adapters.nvflare.classify import AdminErrorCategory as C
from app.adapters.nvflare.classify import classified_error, classify
from app.adapters.nvflare.client import build_admin_client
from app.errors import (
    AdminMisconfigured,
    InvalidRequest,
    NvflareJobNotFound,
    NvflareJobNotRunning,
    ServerUnavailable,
    UnknownAdminError,
)
from app.net_config import NetConfig
from app.settings import Settings

CASES: list[tuple[str, BaseException, C]] = [
    # The server is down, restarting, or the session is gone: transient.
    (
        "new session, server down",
        nv.NoConnection("cannot connect to server for 5.0 seconds"),
        C.SERVER_UNAVAILABLE,
    ),
    (
        "command on a dead connection",
        nv.NoConnection("cannot connect to server: SERVER_CONNECTION"),
        C.SERVER_UNAVAILABLE,
    ),
    ("after close()", nv.SessionClosed("session closed"), C.SERVER_UNAVAILABLE),
    ("idle 1800 s", nv.SessionExpired("session expired"), C.SERVER_UNAVAILABLE),
    ("no reply", nv.NoReply("timeout"), C.SERVER_UNAVAILABLE),
    (
        "cold-start login",
        nv.InternalError("Communication Error - please try later"),
        C.SERVER_UNAVAILABLE,
    ),
    (
        "half-started server",
        nv.InternalError("Can't fetch command list from server."),
        C.SERVER_UNAVAILABLE,
    ),
    (
        "login retries exhausted",
        nv.InternalError("Auto login failed after 1 tries"),
        C.SERVER_UNAVAILABLE,
    ),
    (
        "auth timeout",
        FLCommunicationError("cannot authenticate to server for 5 seconds"),
        C.SERVER_UNAVAILABLE,
    ),
    ("socket", ConnectionResetError("reset by peer"), C.SERVER_UNAVAILABLE),
    ("timeout", TimeoutError("timed out"), C.SERVER_UNAVAILABLE),
    ("no site connected yet", nv.NoClientsAvailable("no clients available"), C.SERVER_UNAVAILABLE),
    # A human must fix the kit or the net: fatal and loud.
    ("kit of another project", FLCommunicationError("error:client_registration"), C.MISCONFIGURED),
    (
        "registration rejected",
        FLCommunicationError("error:client_registration Requested task does not match"),
        C.MISCONFIGURED,
    ),
    (
        "wrong server identity",
        FLCommunicationError("expected server identity is 'a' but got 'b'"),
        C.MISCONFIGURED,
    ),
    (
        "rejected credentials",
        nv.AuthenticationError("Incorrect user name or password"),
        C.MISCONFIGURED,
    ),
    ("not allowed", nv.AuthorizationError("user not authorized for the action"), C.MISCONFIGURED),
    ("client cert of another CA", InvalidCertChain("validation failed"), C.MISCONFIGURED),
    ("broken fed_admin.json", ConfigError("Missing admin section"), C.MISCONFIGURED),
    ("missing key file", FileNotFoundError(2, "No such file or directory"), C.MISCONFIGURED),
    # Job-level answers from a server that works.
    ("unknown job id", nv.JobNotFound("no such job: abc"), C.JOB_NOT_FOUND),
    ("job not running", nv.JobNotRunning("job abc is not running"), C.JOB_NOT_RUNNING),
    (
        "job lost in a restart",
        nv.InternalError("server internal error: Job abc is not running."),
        C.JOB_NOT_RUNNING,
    ),
    ("bad job folder", nv.InvalidJobDefinition("invalid job definition: x"), C.INVALID_REQUEST),
    ("bad submit token", nv.InvalidArgumentError("submit_token must be ..."), C.INVALID_REQUEST),
    # Nobody classified these: retried, logged and counted.
    ("token conflict without a job id", nv.SubmitTokenConflict("conflict"), C.UNKNOWN),
    ("other internal error", nv.InternalError("error: no responses from clients"), C.UNKNOWN),
    ("runtime error", RuntimeError("runtime error encountered: X"), C.UNKNOWN),
]


@pytest.mark.parametrize(("exc", "category"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classify(exc: BaseException, category: C) -> None:
    assert classify(exc) is category


ERROR_CLASS = {
    C.SERVER_UNAVAILABLE: ServerUnavailable,
    C.MISCONFIGURED: AdminMisconfigured,
    C.JOB_NOT_FOUND: NvflareJobNotFound,
    C.JOB_NOT_RUNNING: NvflareJobNotRunning,
    C.INVALID_REQUEST: InvalidRequest,
    C.UNKNOWN: UnknownAdminError,
}


@pytest.mark.parametrize(("exc", "category"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classified_error_has_the_app_class_and_the_raw_exception_as_cause(
    exc: BaseException, category: C
) -> None:
    error = classified_error(exc, "net 'n'")

    assert type(error) is ERROR_CLASS[category]
    assert error.__cause__ is exc
    assert str(error).startswith(f"net 'n': {category.value}: {type(exc).__name__}")


def test_unknown_errors_are_logged_with_the_original_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = nvflare_classify.unknown_errors["RuntimeError"]
    exc = RuntimeError("never seen before")

    with caplog.at_level(logging.WARNING, logger="app.adapters.nvflare.classify"):
        error = classified_error(exc)

    assert isinstance(error, UnknownAdminError)
    assert nvflare_classify.unknown_errors["RuntimeError"] == before + 1
    [record] = [r for r in caplog.records if "unclassified" in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[1] is exc


def test_known_errors_are_not_counted_as_unknown() -> None:
    before = sum(nvflare_classify.unknown_errors.values())
    for _name, exc, category in CASES:
        if category is not C.UNKNOWN:
            classify(exc)
    assert sum(nvflare_classify.unknown_errors.values()) == before


def test_app_errors_pass_through_unchanged() -> None:
    error = ServerUnavailable("already classified")
    assert classified_error(error) is error
    assert classify(AdminMisconfigured("x")) is C.MISCONFIGURED


def test_build_admin_client_takes_its_bounds_from_settings_and_the_net(tmp_path: Path) -> None:
    kit = tmp_path / "admin"
    (kit / "startup").mkdir(parents=True)
    (kit / "startup" / "fed_admin.json").write_text("{}")
    net = NetConfig.model_validate(
        {
            "name": "net-a",
            "driver": {"kind": "static"},
            "admin": {"kit_dir": str(kit), "username": "admin@nvidia.com"},
            "ready_timeout_s": 123.0,
        }
    )
    settings = Settings(
        ADMIN_LOGIN_TIMEOUT_S=7.0, ADMIN_COMMAND_TIMEOUT_S=8.0, ADMIN_LOGIN_MAX_TRIES=2
    )

    client = build_admin_client(net, settings)

    assert (client.net_name, client.kit_dir, client.username) == ("net-a", kit, "admin@nvidia.com")
    assert (client.login_timeout_s, client.command_timeout_s, client.login_max_tries) == (
        7.0,
        8.0,
        2,
    )
    assert client.misconfigured_after_s == 123.0
    assert not client.connected and client.session is None  # lazy: nothing connected yet

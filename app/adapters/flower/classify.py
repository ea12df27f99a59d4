"""Flower's answers in the dispatcher's words: the Control API's failures mapped in one place
(`classified_http_error`, `classified_transport_error`) onto the error classes of
`app.errors` (the same ones the NVFLARE client raises), and Flower run states onto
`RunState`s."""

from __future__ import annotations

import json
import logging
import ssl
from collections import Counter
from datetime import datetime

import httpx

from app.adapters.backend import RunState, RunStatus
from app.errors import (
    AdminMisconfigured,
    DispatcherError,
    InvalidRequest,
    NvflareJobNotFound,
    NvflareJobNotRunning,
    ServerUnavailable,
    UnknownAdminError,
)

log = logging.getLogger(__name__)

# Unclassified Control API answers, by code: a non-zero count is a gap in the tables below.
unknown_errors: Counter[str] = Counter()

# flwr 1.42's ApiErrorCode (flwr/supercore/error/base.py) that mean something here. The
# SuperLink answers an error as HTTP 4xx/5xx with the JSON {"code": N, "detail": "..."}.
RUN_ID_NOT_FOUND = 16
RUN_ALREADY_FINISHED = 18
_JOB_NOT_FOUND = frozenset({RUN_ID_NOT_FOUND})
_JOB_NOT_RUNNING = frozenset({RUN_ALREADY_FINISHED})
# The app or its run config is wrong: FAILED_TO_CREATE_RUN is not one (a state failure).
_INVALID_REQUEST = frozenset(
    {
        15,  # INVALID_RUN_CONFIG: an override the app does not declare, a bad value
        33,  # INVALID_APP_SPEC
        35,  # FAB_DOWNLOAD_FAILURE
        44,  # AGENTAPP_USER_PROMPT_REQUIRED
    }
)
# Fatal until a human fixes the net's settings or the SuperLink's: accounts, federations,
# licences, and a SuperLink of another flwr than the messages vendored here.
_MISCONFIGURED = frozenset(
    {
        1,  # NO_FEDERATION_MANAGEMENT_SUPPORT
        2,  # FEDERATION_NOT_FOUND_OR_NO_PERMISSION
        8,  # ACCOUNT_NOT_A_MEMBER
        9,  # NO_PERMISSIONS
        10,  # FORBIDDEN_ACTION
        12,  # FEDERATION_NOT_SPECIFIED
        13,  # ENTITLEMENT_ERROR
        19,  # NO_ACCOUNT_AUTH
        25,  # FEDERATION_NOT_FOUND
        26,  # FEDERATION_NOT_FOUND_OR_NOT_MEMBER
        29,  # ACCOUNT_INFO_NOT_FOUND
        30,  # RUN_NOT_ASSOCIATED_WITH_ACCOUNT
        31,  # RUN_ID_NOT_BELONG_TO_ACCOUNT
        36,  # ACCOUNT_AUTHENTICATION_FAILED
        37,  # ACCOUNT_AUTHENTICATION_NOT_INITIALIZED
        41,  # LICENSE_CHECK_FAILED
        1001,  # RUNTIME_VERSION_INCOMPATIBLE
        1002,  # UNSUPPORTED_CONTENT_TYPE
        1003,  # INVALID_PROTOBUF_PAYLOAD
        1006,  # INVALID_PROTOBUF_REQUEST
        1007,  # INVALID_PROTOBUF_RESPONSE
    }
)
# Statuses a proxy or a SuperLink still starting (or stopping) answers with: try later.
_UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
# No route: not a flwr 1.42 SuperLink behind this address; no access: credentials.
_MISCONFIGURED_STATUSES = frozenset({401, 403, 404, 405, 415})


def error_code(response: httpx.Response) -> int | None:
    """The Control API's error code in an error answer, or None (no Flower JSON body)."""
    try:
        body = json.loads(response.content)
    except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or nested too deep
        return None
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _detail(response: httpx.Response) -> str:
    try:
        body = json.loads(response.content)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return response.text[:200]
    detail = body.get("detail") if isinstance(body, dict) else None
    return str(detail) if detail is not None else response.text[:200]


def classified_http_error(response: httpx.Response, context: str) -> DispatcherError:
    """The app error for an error answer of the Control API (status >= 400)."""
    code = error_code(response)
    what = f"{context}: HTTP {response.status_code}, code {code}: {_detail(response)}"
    if code in _JOB_NOT_FOUND:
        return NvflareJobNotFound(what)
    if code in _JOB_NOT_RUNNING:
        return NvflareJobNotRunning(what)
    if code in _INVALID_REQUEST:
        return InvalidRequest(what)
    if code in _MISCONFIGURED:
        return AdminMisconfigured(what)
    if code is None and response.status_code in _UNAVAILABLE_STATUSES:
        return ServerUnavailable(what)
    if code is None and response.status_code in _MISCONFIGURED_STATUSES:
        return AdminMisconfigured(what)
    unknown_errors[f"http {response.status_code} code {code}"] += 1
    log.warning("unclassified Flower Control API answer: %s", what)
    return UnknownAdminError(what)


# What OpenSSL says when the peer answers a TLS handshake with no TLS at all: a SuperLink
# started `--insecure` behind a net whose client speaks TLS (flwr 1.42 answers
# WRONG_VERSION_NUMBER, every time; the others are older and newer OpenSSLs' words).
_NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"}
)


def _is_certificate_failure(exc: BaseException) -> bool:
    """A certificate the net's CA does not sign, or a peer that speaks no TLS."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        if isinstance(cause, ssl.SSLError) and cause.reason in _NOT_TLS_REASONS:
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def classified_transport_error(exc: httpx.HTTPError, context: str) -> DispatcherError:
    """The app error for a request that got no answer: down, starting or cut off
    (ServerUnavailable), or a TLS certificate the net's CA does not sign or a SuperLink
    without TLS (AdminMisconfigured: another server, the wrong CA file, or `insecure`)."""
    what = f"{context}: {type(exc).__name__}: {exc}"
    if _is_certificate_failure(exc):
        return AdminMisconfigured(what)
    if isinstance(exc, httpx.TransportError):
        return ServerUnavailable(what)
    unknown_errors[type(exc).__name__] += 1
    log.warning("unclassified Flower Control API failure: %s", what, exc_info=exc)
    return UnknownAdminError(what)


# flwr 1.42's run statuses (flwr/common/constant.py, Status and SubStatus) in the
# dispatcher's words. Pending, starting and running all still occupy the SuperLink.
FINISHED = "finished"
FLOWER_RUN_STATES: dict[str, RunState] = {
    "completed": RunState.COMPLETED,
    "stopped": RunState.ABORTED,
    "failed": RunState.FAILED,
}
# A failed run's details when its ServerApp raised (flwr/superlink/runtime/run_serverapp.py):
# the app's own verdict. Any other failure ("Task failed with unknown error." from a
# ServerApp process cut off from a restarted SuperLink, "... because the run expired" when
# its heartbeats stopped) ended the run without one: LOST, as NVFLARE's ABNORMAL.
APP_FAILURE_PREFIX = "ServerApp failed with exception"


def run_status(status: str, sub_status: str, details: str = "", running_at: str = "") -> RunStatus:
    """Map a Flower run's status; an unknown finished sub-status is a run lost without
    verdict. A running run carries when it went running (`started_at`)."""
    detail = f"Flower {status}:{sub_status}" if sub_status else f"Flower {status}"
    if details:
        detail = f"{detail} ({details})"
    if status != FINISHED:
        return RunStatus(RunState.RUNNING, detail, started_at=epoch_of(running_at))
    state = FLOWER_RUN_STATES.get(sub_status, RunState.LOST)
    if state is RunState.FAILED and not details.startswith(APP_FAILURE_PREFIX):
        state = RunState.LOST
    return RunStatus(state, detail)


def epoch_of(iso: str) -> float | None:
    """An ISO time of the SuperLink's (UTC, with offset) as epoch seconds; None if none."""
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None

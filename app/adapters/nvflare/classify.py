"""nvflare's answers in the dispatcher's words: every exception of nvflare's admin API mapped
in one place (`classify`) into the error classes of `app.errors`, and NVFLARE run statuses
into `RunState`s. What the admin client (`client.py`) and the fakes agree on."""

from __future__ import annotations

import functools
import logging
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from enum import StrEnum

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


class AdminErrorCategory(StrEnum):
    """What an nvflare failure means for the dispatcher."""

    SERVER_UNAVAILABLE = "server_unavailable"  # transient: down, starting, session gone
    MISCONFIGURED = "misconfigured"  # fatal until a human fixes the kit or the net
    JOB_NOT_FOUND = "job_not_found"
    JOB_NOT_RUNNING = "job_not_running"
    INVALID_REQUEST = "invalid_request"  # the job folder or an argument is wrong
    UNKNOWN = "unknown"  # retried, but logged with its cause and counted


# Unclassified nvflare errors, by exception type: a non-zero count is a gap in `classify`.
unknown_errors: Counter[str] = Counter()

_ERROR_CLASSES: dict[AdminErrorCategory, type[DispatcherError]] = {
    AdminErrorCategory.SERVER_UNAVAILABLE: ServerUnavailable,
    AdminErrorCategory.MISCONFIGURED: AdminMisconfigured,
    AdminErrorCategory.JOB_NOT_FOUND: NvflareJobNotFound,
    AdminErrorCategory.JOB_NOT_RUNNING: NvflareJobNotRunning,
    AdminErrorCategory.INVALID_REQUEST: InvalidRequest,
    AdminErrorCategory.UNKNOWN: UnknownAdminError,
}

# Message fragments of nvflare 2.9 errors whose exception type alone is ambiguous.
_STARTING_MARKERS: tuple[str, ...] = (
    "communication error",  # login while the server is still starting (fuel/hci/client/api.py)
    "please try later",
    "server did not respond",
    "can't fetch command list",
    "auto login failed",
    "cannot connect to server",
    "cannot authenticate to server",
    "session is inactive",
)
_NOT_RUNNING_MARKERS: tuple[str, ...] = (
    "is not running",
)  # abort of a job lost in a server restart
_MISCONFIG_MARKERS: tuple[str, ...] = (
    "error:client_registration",  # admin kit of another project (after ~6 s)
    "expected server identity",
    "failed to challenge server",
)


def _type_name(exc: BaseException) -> str:
    return type(exc).__name__


@functools.cache
def _type_rules() -> tuple[tuple[tuple[type[BaseException], ...], AdminErrorCategory], ...]:
    """Exception types whose meaning does not depend on their message, first match wins."""
    from nvflare.fuel.common.excepts import ConfigError
    from nvflare.fuel.f3.cellnet.cell_cipher import InvalidCertChain
    from nvflare.fuel.flare_api import api_spec as nv

    return (
        # SessionExpired is a SessionClosed; NoConnection is a ConnectionError.
        (
            (nv.NoConnection, nv.SessionClosed, nv.NoReply, TimeoutError, ConnectionError),
            AdminErrorCategory.SERVER_UNAVAILABLE,
        ),
        (
            (
                nv.AuthenticationError,
                nv.AuthorizationError,
                InvalidCertChain,  # client certificate not from the server's CA
                ConfigError,
                FileNotFoundError,  # raised while nvflare loads the kit's files
                PermissionError,
            ),
            AdminErrorCategory.MISCONFIGURED,
        ),
        ((nv.JobNotFound,), AdminErrorCategory.JOB_NOT_FOUND),
        ((nv.JobNotRunning,), AdminErrorCategory.JOB_NOT_RUNNING),
        ((nv.InvalidJobDefinition, nv.InvalidArgumentError), AdminErrorCategory.INVALID_REQUEST),
        # The server answered but no site is connected: "not ready yet", a transient state.
        ((nv.NoClientsAvailable,), AdminErrorCategory.SERVER_UNAVAILABLE),
    )


def _by_message(exc: BaseException) -> AdminErrorCategory | None:
    """nvflare reuses InternalError and FLCommunicationError for unrelated failures."""
    from nvflare.apis.fl_exception import FLCommunicationError
    from nvflare.fuel.flare_api.api_spec import InternalError

    text = str(exc).lower()
    markers: tuple[tuple[tuple[str, ...], AdminErrorCategory], ...]
    if isinstance(exc, FLCommunicationError):
        markers = ((_MISCONFIG_MARKERS, AdminErrorCategory.MISCONFIGURED),)
    elif isinstance(exc, InternalError):
        markers = ((_NOT_RUNNING_MARKERS, AdminErrorCategory.JOB_NOT_RUNNING),)
    else:
        return None
    for fragments, category in (
        *markers,
        (_STARTING_MARKERS, AdminErrorCategory.SERVER_UNAVAILABLE),
    ):
        if any(fragment in text for fragment in fragments):
            return category
    return None


def classify(exc: BaseException) -> AdminErrorCategory:
    """The one mapping from an exception raised by nvflare's admin API to its meaning.

    Decided by exception type first, by message only where nvflare reuses a type
    (`InternalError`, `FLCommunicationError`). Anything unmatched is UNKNOWN, logged with
    the original exception and counted in `unknown_errors`.
    """
    if isinstance(exc, DispatcherError):
        return _category_of_dispatcher_error(exc)
    for types, category in _type_rules():
        if isinstance(exc, types):
            return category
    by_message = _by_message(exc)
    if by_message is not None:
        return by_message
    unknown_errors[_type_name(exc)] += 1
    log.warning("unclassified nvflare error %s: %s", _type_name(exc), exc, exc_info=exc)
    return AdminErrorCategory.UNKNOWN


def _category_of_dispatcher_error(exc: DispatcherError) -> AdminErrorCategory:
    for category, cls in _ERROR_CLASSES.items():
        if type(exc) is cls:
            return category
    return AdminErrorCategory.UNKNOWN


def classified_error(exc: BaseException, context: str = "") -> DispatcherError:
    """The app error for `exc` (see `classify`), with `exc` as its `__cause__`.

    Use as `raise classified_error(exc, "net x") from exc`; an app error passes through.
    """
    if isinstance(exc, DispatcherError):
        return exc
    category = classify(exc)
    prefix = f"{context}: " if context else ""
    error = _ERROR_CLASSES[category](f"{prefix}{category.value}: {_type_name(exc)}: {exc}")
    error.__cause__ = exc
    return error


# NVFLARE 2.9.0 RunStatus (nvflare/apis/job_def.py) in the dispatcher's words. Statuses not
# listed (SUBMITTED, APPROVED, DISPATCHED, RUNNING) mean "still going": a SUBMITTED job waits
# for its sites and still occupies the server.
NVFLARE_RUN_STATES: dict[str, RunState] = {
    "FINISHED:COMPLETED": RunState.COMPLETED,
    "FINISHED:ABORTED": RunState.ABORTED,
    "FINISHED:EXECUTION_EXCEPTION": RunState.FAILED,
    "FINISHED:FAILED_TO_RUN": RunState.FAILED,
    "FINISHED:CAN_NOT_SCHEDULE": RunState.FAILED,
    # The run ended without a verdict: decided by LOST_JOB_POLICY like a lost server.
    "FINISHED:ABNORMAL": RunState.LOST,
    "FINISHED:ABANDONED": RunState.LOST,
}


def run_status(raw: str) -> RunStatus:
    """Map an NVFLARE RunStatus string; an unknown FINISHED:* is a run lost without verdict."""
    state = NVFLARE_RUN_STATES.get(raw)
    if state is None:
        state = RunState.LOST if raw.startswith("FINISHED") else RunState.RUNNING
    return RunStatus(state, f"NVFLARE {raw}")


def meta_status(meta: object) -> RunStatus | None:
    """A run's status from its job meta (`get_job_meta`), with the job store's `start_time`
    for a RUNNING run; None when the meta has no status."""
    if not isinstance(meta, dict) or not meta.get("status"):
        return None
    raw = meta["status"]
    status = run_status(str(raw))
    started_at = _epoch_of(meta.get("start_time"))
    if raw == "FINISHED:ABORTED" and started_at is None:
        return replace(status, unstarted=True)
    if raw != "RUNNING":
        return status
    return replace(status, started_at=started_at)


def _epoch_of(iso: object) -> float | None:
    """The job store's `start_time` (an ISO time the server writes in UTC when the run goes
    RUNNING; "" before) as epoch seconds; None when absent or not a time."""
    if not isinstance(iso, str) or not iso:
        return None
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


# The statuses of a job nvflare's job runner has not started yet, and its abort's answer for
# such a job (nvflare/private/fed/server/job_cmds.py, abort_job).
NOT_STARTED = frozenset({"SUBMITTED", "DISPATCHED"})
BEFORE_RUNNING = "before running it"


def aborted_before_start(status: str, message: object) -> bool:
    """An accepted abort hit a run not started yet: its status read before the abort says
    so, or (when that read failed) nvflare's answer, "Aborted the job <id> before running
    it."."""
    return status in NOT_STARTED or (isinstance(message, str) and BEFORE_RUNNING in message)

"""Why a job ended, or why an enqueue was refused: a stable machine-readable code beside the
human reason, and the ONE table that maps each code to flip-api's statuses.

Every terminal move carries a code (`Job.transition` refuses one without), so a receiver
switches on `reason_code` and never parses `reason`. The codes are part of the public
contract (`fl-dispatcher schema`): add codes, never rename or reuse one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from models.states import JobState


class ReasonCode(StrEnum):
    """Why a job reached its terminal state, or why a request created no job."""

    # COMPLETED
    RUN_COMPLETED = "run_completed"
    RESULTS_UPLOADED = "results_uploaded"
    # FAILED: the job's own definition or bundle
    BUNDLE_MISSING = "bundle_missing"
    BUNDLE_TOO_LARGE = "bundle_too_large"
    BUNDLE_UNAVAILABLE = "bundle_unavailable"
    DEFINITION_INVALID = "definition_invalid"
    # FAILED: the run or its server
    RUN_FAILED = "run_failed"
    SERVER_LOST = "server_lost"
    OVERRAN = "overran"
    MAX_ATTEMPTS = "max_attempts"
    NET_REMOVED = "net_removed"
    # flip-api's own report, or its absence
    RESULTS_UPLOAD_FAILED = "results_upload_failed"
    REPORTED_ERROR = "reported_error"
    REPORT_TIMEOUT = "report_timeout"
    # ABORTED
    ABORTED = "aborted"
    REPORTED_STOPPED = "reported_stopped"
    RUN_ABORTED = "run_aborted"
    ABORT_UNCONFIRMED = "abort_unconfirmed"
    # No job was created (a `rejected` event, a rejected lookup)
    REJECTED = "rejected"
    CALLER_KEY_CONFLICT = "caller_key_conflict"


# A code that is about a refused request, never about a job's end.
REQUEST_CODES = frozenset({ReasonCode.REJECTED, ReasonCode.CALLER_KEY_CONFLICT})


@dataclass(frozen=True)
class FlipStatus:
    """flip-api's `ModelStatus` and its scheduler's `JobStatus` for an event; None: leave
    the one flip-api holds unchanged."""

    model_status: str | None
    job_status: str | None


_ERROR = FlipStatus("ERROR", "COMPLETED")
_STOPPED = FlipStatus("STOPPED", "COMPLETED")


@dataclass(frozen=True)
class Reason:
    """One code: what it means, and for each state it may end a job in (None: a refused
    request, no job) flip-api's statuses."""

    meaning: str
    flip: Mapping[JobState | None, FlipStatus]


_OK = FlipStatus("RESULTS_UPLOADED", "COMPLETED")
C, F, A = JobState.COMPLETED, JobState.FAILED, JobState.ABORTED

# The ONE table: every code, the states it ends a job in, and what flip-api sets for each.
# Tests check every terminal move in the code with a code listed here for its state.
REASONS: Mapping[ReasonCode, Reason] = {
    ReasonCode.RUN_COMPLETED: Reason(
        "NVFLARE finished the run (RELEASE_AFTER=finished: the upload status is the training "
        "run's own report)",
        {C: _OK},
    ),
    ReasonCode.RESULTS_UPLOADED: Reason("flip-api reported results_uploaded", {C: _OK}),
    ReasonCode.BUNDLE_MISSING: Reason(
        "the job's bundle (folder or s3:// prefix) does not exist or is empty", {F: _ERROR}
    ),
    ReasonCode.BUNDLE_TOO_LARGE: Reason(
        "the bundle is over S3_MAX_BUNDLE_BYTES or S3_MAX_BUNDLE_FILES", {F: _ERROR}
    ),
    ReasonCode.BUNDLE_UNAVAILABLE: Reason(
        "the bundle cannot be read (access denied, no credentials, an unsafe key)", {F: _ERROR}
    ),
    ReasonCode.DEFINITION_INVALID: Reason(
        "the job definition is invalid (meta.json, or NVFLARE refused the submit)", {F: _ERROR}
    ),
    ReasonCode.RUN_FAILED: Reason(
        "NVFLARE ended the run EXECUTION_EXCEPTION, FAILED_TO_RUN or CAN_NOT_SCHEDULE",
        {F: _ERROR},
    ),
    ReasonCode.SERVER_LOST: Reason(
        "the run's server restarted or vanished, or NVFLARE ended the run ABNORMAL or "
        "ABANDONED, and LOST_JOB_POLICY=fail",
        {F: _ERROR},
    ),
    ReasonCode.OVERRAN: Reason("the run exceeded MAX_RUN_S and was aborted", {F: _ERROR}),
    ReasonCode.MAX_ATTEMPTS: Reason(
        "requeued until max_attempts was used up; `reason` has the last cause", {F: _ERROR}
    ),
    ReasonCode.NET_REMOVED: Reason(
        "the job's net is no longer declared in the settings (for an unpinned QUEUED job: "
        "no declared net has every site it needs, the nets that had them were removed)",
        {F: _ERROR, A: _STOPPED},
    ),
    ReasonCode.RESULTS_UPLOAD_FAILED: Reason(
        "flip-api reported results_upload_failed",
        {F: FlipStatus("RESULTS_UPLOAD_FAILED", "COMPLETED")},
    ),
    ReasonCode.REPORTED_ERROR: Reason("flip-api reported error", {F: _ERROR}),
    ReasonCode.REPORT_TIMEOUT: Reason(
        "no results report from flip-api within REPORT_TIMEOUT_S; the state is "
        "REPORT_TIMEOUT_OUTCOME",
        {F: _ERROR, C: _OK},
    ),
    ReasonCode.ABORTED: Reason(
        "aborted as asked (abort_job, the API, the CLI), or it finished while aborting",
        {A: _STOPPED},
    ),
    ReasonCode.REPORTED_STOPPED: Reason("flip-api reported stopped", {A: _STOPPED}),
    ReasonCode.RUN_ABORTED: Reason(
        "NVFLARE ended the run ABORTED without the dispatcher asking", {A: _STOPPED}
    ),
    ReasonCode.ABORT_UNCONFIRMED: Reason(
        "an abort the server never confirmed within ABORT_TIMEOUT_S", {A: _STOPPED}
    ),
    ReasonCode.REJECTED: Reason(
        "the enqueue was refused (bad payload, unknown net, a definition outside the root): "
        "no job was created",
        {None: _ERROR},
    ),
    ReasonCode.CALLER_KEY_CONFLICT: Reason(
        "the caller_key names a job enqueued with a different payload: no job was created "
        "and that job is unchanged (keep its status)",
        {None: FlipStatus(None, None)},
    ),
}


def allowed(code: ReasonCode, state: JobState) -> bool:
    """May a job end in `state` with `code`?"""
    return state in REASONS[code].flip

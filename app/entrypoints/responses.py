"""What each HTTP route answers, as pydantic models, so /openapi.json describes every
response and FastAPI checks each answer against its model before it leaves.

The read models (`app.usecases.views`) build plain dicts that the CLI prints as they are;
these models describe the same dicts for HTTP. They forbid extra keys: a field added to a
view but not here fails the API tests instead of going out undocumented. Timestamps stay
the ISO 8601 strings the views produce (with their UTC offset).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from models import JobState, NetState, PrewarmOutcome, ReasonCode

Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- errors --------------------------------------------------------------------------------


class FieldError(_Response):
    """One invalid field of a request."""

    loc: list[str] = Field(description="where: body, path or query, then the field")
    msg: str
    type: str


class ErrorResponse(_Response):
    """Every error answer (400, 401, 403, 404, 409, 422, 503)."""

    detail: str = Field(description="what is wrong, for a person")
    errors: list[FieldError] | None = Field(
        default=None, description="422 only: each invalid field"
    )
    reason_code: ReasonCode | PrewarmOutcome | None = Field(
        default=None,
        description="410 and 409 only: `rejected` or `caller_key_conflict`; a prewarm's 409 "
        "for a MISCONFIGURED net: `net_misconfigured`",
    )


def error_responses(*codes: int) -> dict[int | str, dict[str, object]]:
    """`responses=` for a route that can answer these error codes."""
    meaning = {
        400: "The request was understood and refused (e.g. unknown net, bad state).",
        401: "Missing or wrong X-API-Key.",
        403: "Mutating routes are disabled (API_SECRET is unset).",
        404: "No such job (or prewarm).",
        410: "No such job (or prewarm): the request that would have created it was refused "
        "(the reason, and its reason_code).",
        409: "The job or net changed meanwhile (read it again), or the caller_key already "
        "names a job (prewarm) asked with another payload (reason_code caller_key_conflict), "
        "or a prewarm's net is MISCONFIGURED (reason_code net_misconfigured).",
        413: "The request body is larger than API_MAX_BODY_BYTES (refused unread).",
        422: "The request does not match its schema.",
        503: "The database is unavailable.",
    }
    return {code: {"model": ErrorResponse, "description": meaning[code]} for code in codes}


# --- health -----------------------------------------------------------------------------


class Health(_Response):
    """The process is up."""

    status: Literal["ok"]


class Readiness(_Response):
    """The dependency checks: "ok" or the error, per dependency."""

    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(description='"database" and "broker": "ok" or the error')
    failed: list[str] | None = Field(default=None, description="503 only: the failed checks")


# --- jobs ---------------------------------------------------------------------------------


class JobView(_Response):
    """A job as GET /jobs and the CLI show it."""

    id: uuid.UUID
    caller_key: str
    state: JobState
    definition: str
    required_sites: list[str]
    metadata: dict[str, Any] | None = Field(description="flip-api's own object, as given")
    requested_net: str | None
    prewarm_key: str | None = Field(description="the caller_key of the prewarm sent for it")
    net: str | None = Field(description="the net it is or was assigned to")
    priority: int
    attempt: int = Field(
        description="the attempt it is on, or ended on: 1 to max_attempts (the count the CLI, "
        "the nets page and the callbacks' `attempt` show)"
    )
    max_attempts: int
    attempts: int = Field(
        description="attempts used up (0 while the first runs); kept for clients written "
        "before `attempt`, which is the count to show",
        json_schema_extra={"deprecated": True},
    )
    retries: int
    nvflare_job_id: str | None
    last_error: str | None
    reason_code: ReasonCode | None = Field(
        description='why it ended (a terminal job only; tasks/README.md "Reason codes")'
    )
    created_at: Timestamp
    state_changed_at: Timestamp
    assigned_at: Timestamp | None
    dispatched_at: Timestamp | None
    finished_at: Timestamp | None


class JobEventView(_Response):
    """One move of a job's state."""

    from_state: JobState | None
    to_state: JobState
    at: Timestamp
    reason: str = Field(description="why, for a person")
    reason_code: ReasonCode | None = Field(
        description="why, for a program: set on a move to a terminal state"
    )
    attempt: int | None = Field(
        description="the job's attempt when the move happened, as `attempt` counts (null on "
        "history written before migration 0004)"
    )


class CallbackDelivery(_Response):
    """How far the job's history was delivered to flip-api (tasks/README.md, "Status callbacks")."""

    delivered: int = Field(description="events the receiver accepted")
    pending: int = Field(description="events not delivered yet")
    failed: int = Field(description="events rejected CALLBACK_MAX_4XX_TRIES times: given up")
    last_error: str | None = Field(description="the last try that did not succeed, and why")
    next_attempt_at: Timestamp | None = Field(description="the job's next try, if backing off")


class JobDetail(JobView):
    """A job with its history, oldest move first."""

    history: list[JobEventView]
    callbacks: CallbackDelivery | None = Field(description="null while CALLBACK_URL is unset")
    waiting_for: str | None = Field(
        default=None,
        description="a QUEUED job: what holds it besides a free net (its earlier run not "
        "settled yet, its net out of service); null otherwise",
    )


class JobList(_Response):
    """A page of jobs, newest first."""

    jobs: list[JobView]
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null on the last page"
    )


class Enqueued(_Response):
    """POST /jobs: the job (new: 201, or the one the caller key already named: 200)."""

    job_id: uuid.UUID
    state: JobState
    created: bool
    notified: bool | None = Field(
        description="whether the workers were told (null: nothing to tell); "
        "false is harmless, beat finds the job"
    )


class AbortRequested(_Response):
    """POST /jobs/{id}/abort: where the job is now."""

    job_id: uuid.UUID
    state: JobState
    needs_server_abort: bool = Field(description="a worker aborts the run on its server")
    notified: bool | None = Field(description="whether the workers were told")


# --- prewarms --------------------------------------------------------------------------

PrewarmStatus = Literal["warming", "held", "used", "expired", "cancelled", "failed", "refused"]


class PrewarmView(_Response):
    """A prewarm (tasks/README.md "Prewarm"): the net it holds, until when, and how it ended."""

    caller_key: str
    net: str | None = Field(description="the net held (a request for sites: the one chosen)")
    required_sites: list[str]
    within_s: float | None = Field(description="as asked")
    status: PrewarmStatus = Field(
        description="warming (its server coming up) or held (up) while live; then used (a job "
        "was claimed onto the net), expired, cancelled or failed; refused: nothing was started"
    )
    reason_code: PrewarmOutcome | None = Field(
        description="refused only: rejected, caller_key_conflict or net_misconfigured"
    )
    created_at: Timestamp
    hold_until: Timestamp = Field(description="created_at + min(within_s, PREWARM_MAX_S)")
    ready_at: Timestamp | None = Field(description="when its server was seen ready")
    ended_at: Timestamp | None
    job_id: uuid.UUID | None = Field(description="used: the job claimed onto the net")
    detail: str


class Prewarmed(PrewarmView):
    """POST /prewarms: the prewarm (new: 201, or the one the caller key already named: 200)."""

    created: bool
    notified: bool | None = Field(
        description="whether the warm-up was sent (null: nothing to send, the server was up "
        "or coming up); false is harmless, beat starts it"
    )


class NetHold(_Response):
    """A net's live prewarm hold (the one that ends last)."""

    caller_key: str
    hold_until: Timestamp
    status: Literal["warming", "held"]


# --- /fl/status -------------------------------------------------------------------------


class DriverView(_Response):
    """What the net's scale driver reports."""

    desired: int
    running: int
    pending: int
    failure: str | None


class ActiveJob(_Response):
    """The job that holds the net."""

    id: uuid.UUID
    caller_key: str
    state: JobState
    nvflare_job_id: str | None
    state_changed_at: Timestamp


class ScaleEventView(_Response):
    """The net's latest scale decision."""

    action: str
    replicas: int
    outcome: str = Field(description="ok, or the classified error")
    reason: str
    at: Timestamp


ServerStateView = Literal["started", "starting", "unreachable", "not_probed", "unknown"]


class NetStatus(_Response):
    """One configured net."""

    name: str
    state: NetState | None = Field(description="null: no database row yet")
    state_changed_at: Timestamp | None
    idle_since: Timestamp | None
    always_on: bool
    driver_kind: str
    driver: DriverView | None = Field(description="null: not probed, or the probe failed")
    server_state: ServerStateView = Field(
        description="the admin client's answer; not_probed for a STOPPED scale-to-zero net, "
        "unknown when the probe failed or timed out (see error)"
    )
    connected_sites: list[str] | None
    required_sites: list[str]
    active_job: ActiveJob | None
    last_scale_event: ScaleEventView | None
    last_error: str | None = Field(description="the net's last recorded error (SQL)")
    error: str | None = Field(description="this response's probe errors for the net")
    prewarm: NetHold | None = Field(
        default=None,
        description="the live prewarm hold on the net, if any (tasks/README.md 'Prewarm')",
    )


class QueueView(_Response):
    """The queue."""

    queued: int
    oldest_queued_at: Timestamp | None


class FlStatus(_Response):
    """Every configured net and the queue."""

    generated_at: Timestamp
    probed: bool
    probe_timeout_s: float
    queue: QueueView
    nets: list[NetStatus]


def json_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """error_responses for a route whose success is not JSON: FastAPI would document a
    model's errors in the route's own media type, but they are JSON like every route's."""
    return {
        code: {
            "description": answer["description"],
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
            },
        }
        for code, answer in error_responses(*codes).items()
    }

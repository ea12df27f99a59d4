"""Read models: every answer the dispatcher gives about its jobs, nets and prewarms, as one
pydantic model each. The use cases build them; every door serialises the same object: the
HTTP API (its response_model, so /openapi.json describes them), the CLI's `--json`
(`model_dump(mode="json")`), the Celery tasks' results, and the status callbacks, whose
models are also the public contract (`app.contract`).

They forbid extra keys: a field a use case sets that is not declared here fails at once
instead of going out undocumented. Timestamps stay the ISO 8601 strings `datetime.isoformat`
writes (with their UTC offset, "+00:00"): callback receivers verify an HMAC over the exact
bytes (tasks/README.md "Status callbacks"), and pydantic's own datetime form ("Z") would
change them.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from models import Job, JobState, NetState, PrewarmOutcome, ReasonCode

Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


def _known_code(value: object) -> object:
    """A reason code this release knows, else None: a newer release's code (written before
    a rollback; codes are added, never renamed) made every read holding it a 500, one row
    hiding the whole job list. The move's `reason` keeps its words."""
    if isinstance(value, str) and value not in ReasonCode._value2member_map_:
        return None
    return value


# A stored reason code as the status API shows it (an unknown one as null).
StoredReasonCode = Annotated[ReasonCode | None, BeforeValidator(_known_code)]
# Why a QUEUED job waits (app.usecases.queue_place, which decides it).
WaitingReason = Literal[
    "earlier run settling",
    "project at its cap",
    "net drained",
    "no free net",
    "claim pending",
    "no declared net fits it",
]


def iso(value: datetime | None) -> str | None:
    """A timestamp as every read model carries it (None stays None)."""
    return value.isoformat() if value is not None else None


class ReadModel(BaseModel):
    """An answer: its fields are all it says."""

    model_config = ConfigDict(extra="forbid")


# --- jobs ---------------------------------------------------------------------------------


class JobView(ReadModel):
    """A job as GET /jobs and the CLI show it."""

    id: uuid.UUID
    caller_key: str
    state: JobState
    definition: str
    required_sites: list[str]
    metadata: dict[str, Any] | None = Field(description="flip-api's own object, as given")
    requested_net: str | None
    prewarm_key: str | None = Field(description="the caller_key of the prewarm sent for it")
    project_id: str | None = Field(
        default=None,
        description="the project it belongs to (its project_id, or its metadata's); null: "
        "the default project",
    )
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
    reason_code: StoredReasonCode = Field(
        description='why it ended (a terminal job only; tasks/README.md "Reason codes"); '
        "null for a code of a newer release this one does not know"
    )
    created_at: Timestamp
    state_changed_at: Timestamp
    assigned_at: Timestamp | None
    dispatched_at: Timestamp | None
    finished_at: Timestamp | None


class JobEventView(ReadModel):
    """One move of a job's state."""

    from_state: JobState | None
    to_state: JobState
    at: Timestamp
    reason: str = Field(description="why, for a person")
    reason_code: StoredReasonCode = Field(
        description="why, for a program: set on a move to a terminal state (null for a code "
        "of a newer release this one does not know)"
    )
    attempt: int | None = Field(
        description="the job's attempt when the move happened, as `attempt` counts (null on "
        "history written before migration 0004)"
    )


class CallbackDelivery(ReadModel):
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
        "settled yet, its net out of service, every net it may run on drained: 'net "
        "drained: ...'); null otherwise",
    )
    place_in_line: int | None = Field(
        default=None,
        ge=1,
        description="a QUEUED job: 1 + the QUEUED jobs the claim would take before it now "
        "(those a claim may take, before it in the claim's order, that may run on a net it "
        'may run on; tasks/README.md "Place in line"); null otherwise',
    )
    waiting_reason: WaitingReason | None = Field(
        default=None,
        description="a QUEUED job: why it waits, the first that holds: 'earlier run "
        "settling', 'project at its cap', 'net drained', 'no free net', 'claim pending' (a "
        "net it may run on is free: the next claim takes it or a job ahead of it); 'no "
        "declared net fits it' before all (NETS has no net with its sites, or not the net it "
        "is pinned to, since a redeploy); null otherwise",
    )


class JobList(ReadModel):
    """A page of jobs, newest first."""

    jobs: list[JobView]
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null on the last page"
    )


class Enqueued(ReadModel):
    """POST /jobs: the job (new: 201, or the one the caller key already named: 200)."""

    job_id: uuid.UUID
    state: JobState
    created: bool
    notified: bool | None = Field(
        description="whether the workers were told (null: nothing to tell); "
        "false is harmless, beat finds the job"
    )


class AbortRequested(ReadModel):
    """POST /jobs/{id}/abort: where the job is now."""

    job_id: uuid.UUID
    state: JobState
    needs_server_abort: bool = Field(description="a worker aborts the run on its server")
    notified: bool | None = Field(description="whether the workers were told")


# --- prewarms --------------------------------------------------------------------------

PrewarmStatus = Literal["warming", "held", "used", "expired", "cancelled", "failed", "refused"]


class PrewarmView(ReadModel):
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
        description="refused only: rejected, caller_key_conflict, net_misconfigured or net_drained"
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


class NetHold(ReadModel):
    """A net's live prewarm hold (the one that ends last)."""

    caller_key: str
    hold_until: Timestamp
    status: Literal["warming", "held"]


# --- /fl/status -------------------------------------------------------------------------


class DriverView(ReadModel):
    """What the net's scale driver reports."""

    desired: int
    running: int
    pending: int
    failure: str | None


class ActiveJob(ReadModel):
    """The job that holds the net."""

    id: uuid.UUID
    caller_key: str
    state: JobState
    nvflare_job_id: str | None
    state_changed_at: Timestamp

    @classmethod
    def of(cls, job: Job) -> ActiveJob:
        """The job row as every view of its net shows it."""
        return cls(
            id=job.id,
            caller_key=job.caller_key,
            state=job.state,
            nvflare_job_id=job.nvflare_job_id,
            state_changed_at=job.state_changed_at.isoformat(),
        )


class ScaleEventView(ReadModel):
    """The net's latest scale decision."""

    action: str
    replicas: int
    outcome: str = Field(description="ok, or the classified error")
    reason: str
    at: Timestamp


ServerStateView = Literal["started", "starting", "unreachable", "not_probed", "unknown"]


class NetStatus(ReadModel):
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
    drained: bool = Field(
        default=False,
        description="drained (on its own or with the whole deployment): takes no new job "
        "and no prewarm (GET /drain)",
    )


class QueueView(ReadModel):
    """The queue."""

    queued: int
    oldest_queued_at: Timestamp | None


# --- drain (app/entrypoints/README.md "Drain before a redeploy") -----------------------------


DrainState = Literal["none", "draining", "drained"]


class DrainedNet(ReadModel):
    """A drained net and what still runs on it."""

    name: str
    since: Timestamp = Field(description="when its drain began (its own or the deployment's)")
    deployment: bool = Field(description="drained by the whole deployment's drain only")
    declared: bool = Field(description="false: a drain kept for a net NETS no longer declares")
    state: NetState | None = Field(description="null: no database row yet")
    active_job: ActiveJob | None = Field(description="null: nothing left on it")


class DrainView(ReadModel):
    """What is drained: `drained` once no drained net has an active job (FINISHING, waiting
    for flip-api's report, included): then the processes can be stopped for a redeploy."""

    state: DrainState = Field(
        description="none: nothing drained; draining: a drained net still has an active "
        "job; drained: no drained net has one"
    )
    complete: bool = Field(description="state is drained")
    deployment: bool = Field(description="the whole deployment is drained (nets added later too)")
    deployment_since: Timestamp | None
    nets: list[DrainedNet] = Field(description="every drained net, by name")
    queued: int = Field(description="QUEUED jobs: they wait, and run after undrain")


class DrainChanged(DrainView):
    """The answer of a drain or an undrain: the drain now, and whether the assigner was told
    (undrain; null: nothing to tell)."""

    notified: bool | None


class FlStatus(ReadModel):
    """Every configured net and the queue."""

    generated_at: Timestamp
    probed: bool
    probe_timeout_s: float
    queue: QueueView
    nets: list[NetStatus]
    drain: DrainView = Field(description="what is drained, and whether draining is complete")


# --- status callbacks (the public contract: app.contract) ---------------------------------


class StateChangeEvent(ReadModel):
    """A job moved from one state to another (one row of its history)."""

    event_id: int = Field(
        description="the history row's id: grows along a job's history, the same on a "
        "redelivery (drop duplicates by it); also in the webhook-id header"
    )
    kind: Literal["state_change"] = Field(description="switch on it first")
    job_id: uuid.UUID = Field(description="uuid5(job_id_namespace, caller_key)")
    caller_key: str = Field(description="as flip-api enqueued it")
    metadata: dict[str, Any] = Field(description="flip-api's object from the enqueue ({} if none)")
    from_state: JobState | None = Field(description="null on the first event (enqueued)")
    to_state: JobState = Field(description="the state the job moved to")
    at: str = Field(
        description="when the move happened (ISO 8601, UTC)",
        json_schema_extra={"format": "date-time"},
    )
    reason: str = Field(description="why, for a person")
    reason_code: ReasonCode | None = Field(
        description="why, for a program: set on a move to COMPLETED, FAILED or ABORTED "
        "(see reason_codes), null on other moves and on history written before it existed"
    )
    nvflare_job_id: str | None = Field(description="the NVFLARE run when the move happened")
    # ge=1: a receiver validating against the contract refuses a 0.1.0 payload (0-based).
    attempt: int | None = Field(
        ge=1,
        description="the job's attempt when the move happened, from 1 to its max_attempts (the "
        "count GET /jobs/{id}'s `attempt` shows); null on history written before migration 0004",
    )


class RejectedEvent(ReadModel):
    """An enqueue the worker refused: no job was created (the named job, if any, is
    unchanged)."""

    event_id: str = Field(
        pattern=r"^rejected-[0-9]+$",
        description="'rejected-<n>': a string, never equal to a state change's integer id",
    )
    kind: Literal["rejected"] = Field(description="switch on it first")
    job_id: uuid.UUID | None = Field(
        description="the id the job would have had (null without a usable caller_key)"
    )
    caller_key: str | None = Field(description="as sent (null when it had none)")
    reason: str = Field(description="why it was refused, for a person")
    reason_code: Literal[ReasonCode.REJECTED, ReasonCode.CALLER_KEY_CONFLICT] = Field(
        description="rejected, or caller_key_conflict: the key names a job enqueued with "
        "another payload"
    )
    at: str = Field(description="when (ISO 8601, UTC)", json_schema_extra={"format": "date-time"})

"""What a status callback is sent as: a job's event or a refused enqueue as its read model
(`app.read_models.StateChangeEvent`, `RejectedEvent`; tasks/README.md, "Status callbacks"),
encoded, or found undeliverable."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from app.adapters.callbacks import encode_body
from app.read_models import ReadModel, RejectedEvent, StateChangeEvent
from models import JobState, RejectedRequest, attempt_number

# What a payload's `kind` says: a job's move, or an enqueue that created no job.
STATE_CHANGE = "state_change"
REJECTED = "rejected"
REJECTED_EVENT_PREFIX = "rejected-"


def rejected_event_id(rejection_id: int) -> str:
    """A rejected event's id: a string, so it never equals a job event's integer id."""
    return f"{REJECTED_EVENT_PREFIX}{rejection_id}"


class JobFields(Protocol):
    """What a job event's payload needs of its job (a Job, or the delivery's JobRef)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def caller_key(self) -> str: ...
    @property
    def metadata_(self) -> dict[str, Any] | None: ...
    @property
    def max_attempts(self) -> int: ...


class EventFields(Protocol):
    """What it needs of the event (a JobEvent, or a row of its columns)."""

    @property
    def id(self) -> int: ...
    @property
    def from_state(self) -> JobState | None: ...
    @property
    def to_state(self) -> JobState: ...
    @property
    def at(self) -> datetime: ...
    @property
    def reason(self) -> str: ...
    @property
    def reason_code(self) -> str | None: ...
    @property
    def nvflare_job_id(self) -> str | None: ...
    @property
    def attempt(self) -> int | None: ...


def event_payload(job: JobFields, event: EventFields) -> StateChangeEvent:
    """What one job event is sent as (tasks/README.md, "Status callbacks")."""
    return StateChangeEvent(
        event_id=event.id,
        kind=STATE_CHANGE,
        job_id=job.id,
        caller_key=job.caller_key,
        metadata=job.metadata_ if job.metadata_ is not None else {},
        from_state=event.from_state,
        to_state=event.to_state,
        at=event.at.isoformat(),
        reason=event.reason,
        reason_code=event.reason_code,
        nvflare_job_id=event.nvflare_job_id,
        # The attempt as every view counts it (models.attempts): 1 on the first.
        attempt=attempt_number(event.attempt, job.max_attempts)
        if event.attempt is not None
        else None,
    )


def rejection_payload(rejection: RejectedRequest) -> RejectedEvent:
    """What a refused enqueue is sent as: no job was created; `job_id` is the id the job
    would have had (null when the payload carried no caller_key)."""
    return RejectedEvent(
        event_id=rejected_event_id(rejection.id),
        kind=REJECTED,
        job_id=rejection.job_id,
        caller_key=rejection.caller_key,
        reason=rejection.reason,
        reason_code=rejection.reason_code,
        at=rejection.at.isoformat(),
    )


@dataclass(frozen=True)
class Undeliverable:
    """An event whose payload cannot be encoded (stored before payloads were checked, or a
    reason no encoder takes): it is failed for good without a try."""

    problem: str


def encoded(payload_of: Callable[..., ReadModel], *rows: Any) -> bytes | Undeliverable:
    """The body to send, or why no try could ever send it (a row its model refuses is one:
    pydantic's ValidationError is a ValueError)."""
    try:
        return encode_body(payload_of(*rows).model_dump(mode="json"))
    except (UnicodeError, ValueError, TypeError) as exc:
        return Undeliverable(f"payload cannot be encoded: {type(exc).__name__}: {exc}"[:500])

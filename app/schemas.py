"""The payloads flip-api sends (Celery tasks and HTTP), validated by pydantic.

Shared by the tasks, the status API and `app.client`, so all three accept exactly the same.
Imports pydantic only (no settings, database or worker code), so `app.client` stays light.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from app import names
from app.errors import field_name
from app.payload_json import nesting_depth, unreadable_in

# A caller's key (a job's, a prewarm's): flip-api's per-run ids. `/`-separated segments,
# none empty, `.` or `..`: an HTTP client drops dot segments and proxies merge slashes, so
# GET /jobs/by-key/a/../b would reach the job keyed b. (No lookahead: pydantic's regex
# engine has none.)
_KEY_SEGMENT = (
    r"(?:[A-Za-z0-9_:@-][A-Za-z0-9._:@-]*|\.[A-Za-z0-9_:@-][A-Za-z0-9._:@-]*|\.\.[A-Za-z0-9._:@-]+)"
)
CALLER_KEY_PATTERN = rf"^{_KEY_SEGMENT}(?:/{_KEY_SEGMENT})*$"


def _key_segments(value: object) -> object:
    """A clear reason for a key with a segment a URL would lose (the pattern refuses it too,
    with a message naming only the pattern)."""
    if isinstance(value, str) and any(seg in ("", ".", "..") for seg in value.split("/")):
        raise ValueError(
            "a '/'-separated segment is empty, '.' or '..': HTTP clients rewrite such a path, "
            "so the key could not be looked up (GET .../by-key/{key}); send it without them"
        )
    return value


# A net's name, in a payload and in the nets' declaration (app.settings).
NET_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"

# A project's id (issue 40: fair share between projects), in a payload, in the job's
# `metadata.project_id` where FLIP puts it, and in PROJECT_SHARES: one segment of a caller
# key's characters (no '/'), not starting with '.', at most 100 characters.
PROJECT_ID_MAX_CHARS = 100
PROJECT_ID_PATTERN = rf"^[A-Za-z0-9_:@-][A-Za-z0-9._:@-]{{0,{PROJECT_ID_MAX_CHARS - 1}}}$"


def project_id_from(value: object) -> str | None:
    """`value` if it is a valid project id (PROJECT_ID_PATTERN), else None."""
    if isinstance(value, str) and re.fullmatch(PROJECT_ID_PATTERN, value):
        return value
    return None


# Job ids are derived from flip-api's key, so a caller knows the id without waiting for a
# reply (Celery results are not used) and a repeated enqueue names the same job.
JOB_ID_NAMESPACE = uuid.UUID("5b0f7c1e-7d2a-4f3c-9a57-3f1e2d9b8c41")


def job_id_for(caller_key: str) -> uuid.UUID:
    """The job id that enqueueing `caller_key` creates (stable across processes)."""
    return uuid.uuid5(JOB_ID_NAMESPACE, caller_key)


METADATA_MAX_BYTES = 16 * 1024
# How deep `metadata` may nest (the object itself is level 1). FLIP's is flat; the bound
# keeps every later step (the digest, JSONB, a callback's encoding) far from its own limits.
METADATA_MAX_DEPTH = 32


def unstorable(text: str) -> str | None:
    """Why `text` cannot be stored or sent as is (None: it can): PostgreSQL's text and
    JSONB refuse NUL, and a lone surrogate (valid in JSON as an escape) has no UTF-8 form,
    so it could be neither stored on PostgreSQL nor sent in a callback."""
    if "\x00" in text:
        return "holds a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "holds a lone surrogate (not UTF-8)"
    return None


def _storable_text(text: str) -> str:
    problem = unstorable(text)
    if problem is not None:
        raise ValueError(f"{problem}: it cannot be stored")
    return text


# A string field outside the payloads (an HTTP body's) that PostgreSQL must be able to hold.
StorableText = Annotated[str, AfterValidator(_storable_text)]


def require_storable(text: str, what: str) -> str:
    """`text` as given if PostgreSQL can hold it; InvalidRequest naming `what` if not (a
    key or a reason from a URL or a body, before any query sees it: the driver's error
    would be a 503 with a traceback, and nothing stored can hold such a key anyway)."""
    from app.errors import InvalidRequest

    problem = unstorable(text)
    if problem is not None:
        raise InvalidRequest(f"{what} {problem}: it cannot be stored, so nothing has it")
    return text


def _check_storable(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no such number: PostgreSQL's json refuses it, a callback could not carry it.
        raise ValueError(f"{where} is {value}, which JSON cannot hold: it cannot be stored")
    if isinstance(value, str):
        problem = unstorable(value)
        if problem is not None:
            raise ValueError(f"{where} {problem}: it cannot be stored or sent")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_storable(key, f"{where} key")
            inner = f"{where}.{field_name(key)}" if unstorable(str(key)) is None else where
            _check_storable(item, inner)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_storable(item, f"{where}[{index}]")


def storable(text: str) -> str:
    """`text` with NUL and lone surrogates escaped (`\\x00`, `\\ud800`), for recording a
    refused request whose own words could not be stored."""
    if unstorable(text) is None:
        return text
    escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return escaped.replace("\x00", "\\x00")


# The longest caller_key (jobs, prewarms and their refusals store it in 200 characters).
CALLER_KEY_MAX_CHARS = 200


def recorded_caller_key(key: str) -> str:
    """How a refused request's caller_key is stored and looked up: as sent (escaped by
    `storable`) when it fits the column, else its head, an ellipsis and a digest of the whole.
    Never cut to a prefix alone, which may be another request's key; the ellipsis is outside
    CALLER_KEY_PATTERN, so no accepted key is ever of this form."""
    shown = storable(key)
    if len(shown) <= CALLER_KEY_MAX_CHARS:
        return shown
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return shown[: CALLER_KEY_MAX_CHARS - 17] + "\u2026" + digest


def _digest(fields: dict[str, Any]) -> str:
    if isinstance(fields.get("required_sites"), list):
        fields["required_sites"] = sorted(fields["required_sites"])  # in any order
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _as_sent(model: BaseModel) -> dict[str, Any]:
    """The payload as its caller sent it: the fields it set, and the names of those it
    left out (whatever default they got)."""
    fields = model.model_dump(mode="json")
    sent = {name: value for name, value in fields.items() if name in model.model_fields_set}
    sent["omitted"] = sorted(fields.keys() - model.model_fields_set)
    return sent


def _whole_number(value: Any) -> Any:
    # JSON Schema's "integer" includes 5.0, which many JSON encoders send for 5: read it as
    # 5, as the printed schema promises. 5.5, a bool or a numeric string stays what it is,
    # and the strict check after this refuses it.
    if type(value) is float and value.is_integer():
        return int(value)
    return value


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _readable(cls, data: Any) -> Any:
        # A value the JSON decoder could not read (loads_payload) is refused by name first,
        # before any validator tries to use it.
        problem = unreadable_in(data) if isinstance(data, dict) else None
        if problem is not None:
            raise ValueError(problem)
        return data

    @model_validator(mode="after")
    def _storable(self) -> _Payload:
        # Every string of a payload, however deep, is stored (PostgreSQL) and sent back in
        # callbacks: one that can be neither is refused here, with the field it is in.
        for name in type(self).model_fields:
            _check_storable(getattr(self, name), name)
        return self


class EnqueueJob(_Payload):
    """Ask for a training job to run; idempotent on `caller_key`."""

    caller_key: str = Field(
        min_length=1,
        max_length=200,
        pattern=CALLER_KEY_PATTERN,
        description="flip-api's key for this run, unique per job; the job id is "
        "uuid5(job_id namespace, caller_key). A repeat with the same payload names the same "
        "job; with another payload it is refused (caller_key_conflict)",
    )
    definition: str = Field(
        min_length=1,
        max_length=1024,
        description="the job bundle: a folder name under JOB_ROOT, or s3://bucket/prefix",
    )
    required_sites: list[str] = Field(
        default_factory=list,
        description="the NVFLARE sites the job runs on (empty: the net's required_sites)",
    )
    net: str | None = Field(
        default=None, pattern=NET_NAME_PATTERN, description="run only on this net (null: any)"
    )
    # Numbers are strict (here and in PrewarmNet): a bool or a numeric string is a caller's
    # mistake, never read as 1 or 30; 5.0 is 5, as JSON Schema's integer says.
    priority: int = Field(
        default=0, ge=-1000, le=1000, strict=True, description="higher runs first"
    )
    max_attempts: int | None = Field(
        default=None,
        ge=1,
        le=100,
        strict=True,
        description="attempts before FAILED (null: MAX_ATTEMPTS)",
    )
    # flip-api's own JSON object (FLIP puts model_id and project_id there; caller_key is its
    # per-run job id, since model ids repeat across re-runs). Stored and returned as given.
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="flip-api's JSON object (string keys, at most 16 KiB), returned in every "
        "view and callback; a resource_spec in it goes into the submitted meta.json",
    )

    prewarm_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=CALLER_KEY_PATTERN,
        description="the caller_key of a prewarm sent for this job: the claim prefers the net "
        "it holds",
    )

    project_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=PROJECT_ID_MAX_CHARS,
        pattern=PROJECT_ID_PATTERN,
        description="the FLIP project the job belongs to: the claim shares the nets between "
        "projects (PROJECT_SHARES). Null: metadata.project_id if that is a valid project id, "
        "else the default project",
    )

    _keys = field_validator("caller_key", "prewarm_key", mode="before")(_key_segments)

    def project(self) -> str | None:
        """The job's project: `project_id`, else a valid `metadata.project_id`, else None
        (the default project)."""
        if self.project_id is not None:
            return self.project_id
        return project_id_from((self.metadata or {}).get("project_id"))

    @field_validator("priority", "max_attempts", mode="before")
    @classmethod
    def _whole(cls, value: Any) -> Any:
        return _whole_number(value)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        if any(not isinstance(key, str) for key in value):
            raise ValueError("metadata keys must be strings")
        # Bounded first, without recursion: serialising it below must not be what fails.
        if nesting_depth(value, METADATA_MAX_DEPTH) > METADATA_MAX_DEPTH:
            raise ValueError(f"metadata nests deeper than {METADATA_MAX_DEPTH} levels")
        # Measured as stored, in UTF-8: the default's `\uXXXX` escapes counted a character
        # of another script as 6 bytes, not 3. A lone surrogate (stored escaped) counts as 3.
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            # A value JSON has no form for: Celery's serializer (kombu's json) decodes a
            # UUID, datetime or Decimal a Python caller put in as that object, and a
            # TypeError is no validation error: the request would fail, acknowledged away.
            raise ValueError(
                f"metadata holds a value that is not JSON ({exc}): send it as a string"
            ) from None
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > METADATA_MAX_BYTES:
            raise ValueError(f"metadata is {size} bytes serialised; at most {METADATA_MAX_BYTES}")
        return value

    def digest(self) -> str:
        """What makes two enqueues of one caller_key the same request: the payload with its
        defaults filled in (an omitted field equals its default sent), sites in any order.
        prewarm_key counts only when set, so the digests stored before it existed still
        name their jobs. The project counts as the job gets it (`project`): sent as
        `project_id` or in `metadata.project_id`, it is the same request (see
        `_project_as_metadata`)."""
        fields = self.model_dump(mode="json")
        if fields["prewarm_key"] is None:
            del fields["prewarm_key"]
        _project_as_metadata(fields)
        return _digest(fields)

    def sent_digest(self) -> str:
        """The request as sent (`_as_sent`): a repeat with the same one is the same request
        whatever defaults a redeploy changed since; one that leaves out a value the first
        sent is not (`digest` still matches it where today's defaults give that value). A
        payload without `project_id` has the digest it had before the field existed."""
        sent = _as_sent(self)
        if sent.get("project_id") is None:
            sent.pop("project_id", None)
            sent["omitted"] = [name for name in sent["omitted"] if name != "project_id"]
        return _digest(sent)

    @field_validator("required_sites")
    @classmethod
    def _sites(cls, sites: list[str]) -> list[str]:
        return _clean_sites(sites)


def _project_as_metadata(fields: dict[str, Any]) -> None:
    """A payload's `project_id` written as FLIP writes it, in `metadata.project_id`, when
    that says the same (the key absent, or holding that very id): a repeat that sends the
    project in the other place is the same request. A payload without it is left as it was
    before the field existed; one whose metadata names another project keeps both."""
    project = fields.pop("project_id")
    if project is None:
        return
    metadata = fields["metadata"]
    if metadata is None:
        fields["metadata"] = {"project_id": project}
    elif "project_id" not in metadata:
        fields["metadata"] = {**metadata, "project_id": project}
    elif metadata["project_id"] != project:
        fields["project_id"] = project


def _clean_sites(sites: list[str]) -> list[str]:
    cleaned = [s.strip() for s in sites]
    if any(not s for s in cleaned):
        raise ValueError("site names must be non-empty")
    if len(set(cleaned)) != len(cleaned):
        raise ValueError("site names must be unique")
    return cleaned


# The longest hint a payload may carry; PREWARM_MAX_S bounds what is actually held.
PREWARM_WITHIN_MAX_S = 86400.0


class PrewarmNet(_Payload):
    """Say a job for a net (or for these sites) is likely within `within_s` seconds: the
    net's server is brought up and held ready until then (at most PREWARM_MAX_S), then left
    to the net's idle grace. Idempotent on `caller_key`."""

    caller_key: str = Field(
        min_length=1,
        max_length=200,
        pattern=CALLER_KEY_PATTERN,
        description="flip-api's key for this hint (its own namespace: it may equal the coming "
        "job's caller_key). A repeat with the same payload names the same prewarm; with "
        "another payload it is refused (caller_key_conflict)",
    )
    net: str | None = Field(
        default=None,
        pattern=NET_NAME_PATTERN,
        description="the net to warm (null: the net a job needing required_sites would be "
        "claimed on)",
    )
    required_sites: list[str] = Field(
        default_factory=list,
        description="the sites the coming job needs (empty: the net's required_sites); the "
        "server counts as ready once they are connected",
    )
    within_s: float = Field(
        gt=0,
        le=PREWARM_WITHIN_MAX_S,
        strict=True,
        description="the job is likely within this many seconds: the server is held ready "
        "until then, at most PREWARM_MAX_S",
    )

    _key = field_validator("caller_key", mode="before")(_key_segments)

    @field_validator("required_sites")
    @classmethod
    def _sites(cls, sites: list[str]) -> list[str]:
        return _clean_sites(sites)

    def digest(self) -> str:
        """What makes two prewarms of one caller_key the same request (sites in any order)."""
        return _digest(self.model_dump(mode="json"))

    def sent_digest(self) -> str:
        """The request as sent (`EnqueueJob.sent_digest`)."""
        return _digest(_as_sent(self))


class CancelPrewarm(_Payload):
    """Cancel a prewarm: its hold ends now and the net's idle grace starts."""

    caller_key: str = Field(
        min_length=1, max_length=200, description="the caller_key the prewarm was sent with"
    )


class AbortJob(_Payload):
    """Abort a job by its id."""

    job_id: uuid.UUID = Field(description="the job to abort")
    reason: str = Field(
        default="aborted by caller", max_length=500, description="kept in the job's history"
    )


class ReportedStatus(StrEnum):
    """flip-api's terminal-status signal for a job it was watching."""

    RESULTS_UPLOADED = "results_uploaded"
    RESULTS_UPLOAD_FAILED = "results_upload_failed"
    ERROR = "error"
    STOPPED = "stopped"


class ReportJobStatus(_Payload):
    """flip-api says a job reached a terminal state on its side."""

    job_id: uuid.UUID = Field(description="the job flip-api reports on")
    status: ReportedStatus = Field(
        description="results_uploaded: COMPLETED; results_upload_failed or error: FAILED; "
        "stopped: ABORTED"
    )
    detail: str = Field(default="", max_length=2000, description="appended to the reason")


# The payload each public task takes (as its `payload` kwarg), by task name.
PUBLIC_PAYLOADS: dict[str, type[_Payload]] = {
    names.ENQUEUE_JOB: EnqueueJob,
    names.ABORT_JOB: AbortJob,
    names.REPORT_JOB_STATUS: ReportJobStatus,
    names.PREWARM: PrewarmNet,
    names.CANCEL_PREWARM: CancelPrewarm,
}
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def payload_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of each public task's payload, keyed by task name, so a caller in
    any language can validate before sending (`fl-dispatcher schema` prints it)."""
    return {
        task: {"$schema": JSON_SCHEMA_DIALECT, **model.model_json_schema()}
        for task, model in PUBLIC_PAYLOADS.items()
    }

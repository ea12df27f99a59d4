"""What is HTTP's own in the routes' answers: the error body every error status carries, the
health checks, and the `responses=` metadata that puts them in /openapi.json. What a route
answers about jobs, nets and prewarms is a read model (`app.read_models`), shared with the
CLI, the tasks and the callbacks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from models import PrewarmOutcome, ReasonCode


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
        "for a MISCONFIGURED net: `net_misconfigured`, for a drained one: `net_drained`",
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
        "or a prewarm's net is MISCONFIGURED (reason_code net_misconfigured) or drained "
        "(reason_code net_drained).",
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

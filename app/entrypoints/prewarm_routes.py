"""The prewarm routes (tasks/README.md "Prewarm"): POST /prewarms, POST /prewarms/cancel and
GET /prewarms/{caller_key}, installed by `app.entrypoints.api.create_app`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool

from app.entrypoints.responses import error_responses
from app.read_models import Prewarmed, PrewarmView
from app.runtime import Runtime
from app.schemas import CancelPrewarm, PrewarmNet
from app.usecases import prewarm

# api._read_body: parse a request's JSON body into a model after the key check.
ReadBody = Callable[..., Awaitable[Any]]


def install(app: FastAPI, runtime: Runtime, require_api_key: Any, read_body: ReadBody) -> None:
    """tasks/README.md "Prewarm": the task's use case, its payloads and idempotency, over HTTP.
    `require_api_key` and `read_body` are the job routes' key check and body parser."""

    @app.post(
        "/prewarms",
        tags=["prewarms"],
        operation_id="prewarm_net",
        status_code=201,
        dependencies=[Depends(require_api_key)],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": PrewarmNet.model_json_schema()}},
            }
        },
        response_model=Prewarmed,
        responses={
            200: {
                "model": Prewarmed,
                "description": "The caller key already named a prewarm: that prewarm.",
            },
            **error_responses(400, 401, 403, 409, 413, 422, 503),
        },
    )
    async def post_prewarm(request: Request, response: Response) -> Prewarmed:
        """A job is likely within `within_s`: bring its net's server up and hold it ready
        until then (at most PREWARM_MAX_S). 201 created, 200 existing; 409 with reason_code
        net_misconfigured for a MISCONFIGURED net, caller_key_conflict for another payload
        under the key."""
        payload = await read_body(request, PrewarmNet, optional=False)
        requested = await run_in_threadpool(prewarm.request_prewarm, runtime, payload)
        response.status_code = 201 if requested.created else 200
        response.headers["Location"] = f"/prewarms/{payload.caller_key}"
        return requested.answer()

    @app.post(
        "/prewarms/cancel",
        tags=["prewarms"],
        operation_id="cancel_prewarm",
        dependencies=[Depends(require_api_key)],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": CancelPrewarm.model_json_schema()}},
            }
        },
        response_model=PrewarmView,
        responses=error_responses(401, 403, 404, 410, 413, 422, 503),
    )
    async def post_cancel_prewarm(request: Request) -> PrewarmView:
        """End a prewarm's hold now (the net's idle grace starts); an ended one keeps its
        outcome."""
        payload = await read_body(request, CancelPrewarm, optional=False)
        return await run_in_threadpool(prewarm.cancel_prewarm, runtime, payload.caller_key)

    @app.get(
        "/prewarms/{caller_key:path}",
        tags=["prewarms"],
        operation_id="get_prewarm",
        response_model=PrewarmView,
        responses=error_responses(404, 410, 503),
    )
    def get_prewarm(caller_key: str) -> PrewarmView:
        """The prewarm a caller_key names (410: it was refused, with its reason_code)."""
        with runtime.sessions() as session:
            return prewarm.get_prewarm(session, caller_key, runtime.clock())

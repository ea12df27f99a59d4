"""The drain routes (app/entrypoints/README.md "Drain before a redeploy"): GET /drain, and
POST /drain and POST /undrain behind the API key, installed by
`app.entrypoints.api.create_app`. An operator's door, not flip-api's contract."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from app.entrypoints.responses import error_responses
from app.read_models import DrainChanged, DrainView
from app.runtime import Runtime
from app.schemas import StorableText
from app.usecases import drains

# api._read_body: parse a request's JSON body into a model after the key check.
ReadBody = Callable[..., Awaitable[Any]]


class UndrainBody(BaseModel):
    """The nets to undrain, or all of them."""

    model_config = ConfigDict(extra="forbid")
    nets: list[StorableText] = Field(
        default_factory=list, max_length=1000, description="declared nets"
    )
    all: bool = Field(default=False, description="every drain (the whole deployment's too)")


class DrainBody(UndrainBody):
    """The nets to drain, or the whole deployment (nets added to NETS later too)."""

    reason: StorableText = Field(
        default="", max_length=drains.DRAIN_REASON_MAX_CHARS, description="kept with the drain"
    )


def install(app: FastAPI, runtime: Runtime, require_api_key: Any, read_body: ReadBody) -> None:
    """The drain use case over HTTP. `require_api_key` and `read_body` are the job routes'
    key check and body parser."""

    def post(
        path: str, operation_id: str, schema: type[BaseModel]
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A POST route behind the key whose JSON body is `schema` (parsed by the handler)."""
        return app.post(
            path,
            tags=["drain"],
            operation_id=operation_id,
            dependencies=[Depends(require_api_key)],
            openapi_extra={
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": schema.model_json_schema()}},
                }
            },
            response_model=DrainChanged,
            responses=error_responses(400, 401, 403, 413, 422, 503),
        )

    @app.get(
        "/drain",
        tags=["drain"],
        operation_id="get_drain",
        response_model=DrainView,
        responses=error_responses(503),
    )
    def get_drain() -> DrainView:
        """What is drained, and whether draining is complete (`state` drained: no drained
        net has an active job, FINISHING included)."""
        return drains.drain_view(runtime)

    @post("/drain", "drain", DrainBody)
    async def post_drain(request: Request) -> DrainChanged:
        """Drain `nets` or `all`: no new claim or prewarm on them; what runs finishes, then
        their servers scale to zero after their idle grace; queued jobs wait. Idempotent."""
        payload = await read_body(request, DrainBody, optional=False)
        return await run_in_threadpool(
            lambda: drains.drain(
                runtime, payload.nets, everything=payload.all, reason=payload.reason
            )
        )

    @post("/undrain", "undrain", UndrainBody)
    async def post_undrain(request: Request) -> DrainChanged:
        """Undrain `nets` or `all`, and kick the assigner (`notified`)."""
        payload = await read_body(request, UndrainBody, optional=False)
        return await run_in_threadpool(
            lambda: drains.undrain(runtime, payload.nets, everything=payload.all)
        )

"""The status API's errors: each refusal and failure a route raises, answered with its
status and a JSON `detail` that never quotes the database's words, and quotes a caller's
input at most as a short excerpt, escaped (`app.errors.quoted`: 80 characters, no markup,
quote or control character), never whole."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm.exc import StaleDataError

from app.errors import (
    CallerKeyConflict,
    InvalidRequest,
    NetDrained,
    NetMisconfigured,
    NotFound,
    RequestRejected,
    TransientError,
    field_name,
)
from models import IllegalTransition

log = logging.getLogger("app.entrypoints.api")


class Refused(Exception):
    """An authentication refusal (401 or 403) with its message."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def error(status: int, detail: str, **more: Any) -> JSONResponse:
    # A message quoting what the caller sent (an unknown net's name) may hold text UTF-8
    # cannot encode (a lone surrogate): escaped, so the refusal is not a 500 of its own.
    detail = detail.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"detail": detail, **more}, status_code=status)


def validation_response(errors: Sequence[Any]) -> JSONResponse:
    """422 naming each field and what is wrong; the input's value is not echoed back, and a
    field name the caller made up (an extra key) only as a short, escaped excerpt."""
    items = [
        {
            "loc": [field_name(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors
    ]
    detail = "; ".join(f"{'.'.join(i['loc']) or 'body'}: {i['msg']}" for i in items)
    return error(422, detail or "invalid request", errors=items)


def install_error_handlers(app: FastAPI) -> None:
    """Each refusal and failure a route may raise, as its status and a JSON `detail`."""

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
        return error(400, str(exc))

    @app.exception_handler(CallerKeyConflict)
    async def _key_conflict(_: Request, exc: CallerKeyConflict) -> JSONResponse:
        # A reused caller_key with another payload: nothing was created or changed.
        return error(409, str(exc), reason_code="caller_key_conflict")

    @app.exception_handler(NetMisconfigured)
    async def _net_misconfigured(_: Request, exc: NetMisconfigured) -> JSONResponse:
        # A prewarm for a net an operator must fix first: nothing was started.
        return error(409, str(exc), reason_code="net_misconfigured")

    @app.exception_handler(NetDrained)
    async def _net_drained(_: Request, exc: NetDrained) -> JSONResponse:
        # A prewarm for a drained net: nothing was started or held (app.usecases.drains).
        return error(409, str(exc), reason_code="net_drained")

    @app.exception_handler(RequestRejected)
    async def _rejected(_: Request, exc: RequestRejected) -> JSONResponse:
        # 410: the id names a job whose enqueue was refused, not one still on its way.
        return error(410, str(exc), reason_code=exc.reason_code)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return error(404, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc.errors())

    @app.exception_handler(Refused)
    async def _refused(_: Request, exc: Refused) -> JSONResponse:
        headers = {"WWW-Authenticate": "X-API-Key"} if exc.status == 401 else None
        return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=headers)

    @app.exception_handler(IllegalTransition)
    async def _conflict(_: Request, exc: IllegalTransition) -> JSONResponse:
        return error(409, f"{exc}; the job changed meanwhile, read it again")

    @app.exception_handler(StaleDataError)
    async def _stale(_: Request, exc: StaleDataError) -> JSONResponse:
        return error(409, "the row was changed by another process meanwhile; retry")

    @app.exception_handler(TransientError)
    async def _not_now(_: Request, exc: TransientError) -> JSONResponse:
        # Something the request needs cannot answer now (a job root on a file system that
        # fails): the caller may send it again, as for a database that cannot answer.
        log.warning("request not carried out now", extra={"reason": str(exc)})
        return error(503, "a dependency of this request cannot answer now (see the API log)")

    @app.exception_handler(DBAPIError)
    async def _db_down(_: Request, exc: DBAPIError) -> JSONResponse:
        # The driver's message can quote SQL and parameters: log it, answer generically.
        log.error("database error", exc_info=exc)
        return error(503, "database unavailable or failing; see the API log")

"""Prewarm: flip-api's hint that a job is coming (`prewarm`, `cancel_prewarm`, on the
requests queue), and the warm-up that brings the net's server up (on the pipeline queue).
A refused prewarm is logged as one line and recorded, never retried."""

from __future__ import annotations

import logging
from typing import Any

from app import names
from app.errors import InvalidRequest, NotFound
from app.schemas import CancelPrewarm, PrewarmNet
from app.usecases import intake, prewarm, prewarm_warm_up
from tasks.base import dispatcher_task, runtime

log = logging.getLogger(__name__)


@dispatcher_task(names.PREWARM, caller_intent=True)
def prewarm_net(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Hold the net a job is likely to need ready for `within_s` seconds (idempotent on
    caller_key); a refusal is recorded with its reason code and returned."""
    rt = runtime()
    try:
        request = intake.parse_payload(PrewarmNet, payload)
    except InvalidRequest as exc:
        key = intake.caller_key_of(payload)
        code = prewarm.refuse_prewarm(rt, key, exc)
        return {"refused": str(exc), "reason_code": str(code), "caller_key": key}
    try:
        requested = prewarm.request_prewarm(rt, request)
    except InvalidRequest as exc:  # recorded by the use case
        code = prewarm.refusal_code(exc)
        return {"refused": str(exc), "reason_code": str(code), "caller_key": request.caller_key}
    return {**requested.prewarm, "created": requested.created}


@dispatcher_task(names.CANCEL_PREWARM, caller_intent=True)
def cancel_prewarm(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """End a prewarm's hold now; the net's idle grace starts."""
    try:
        request = intake.parse_payload(CancelPrewarm, payload)
        return prewarm.cancel_prewarm(runtime(), request.caller_key)
    except (InvalidRequest, NotFound) as exc:
        log.warning("prewarm cancel rejected: %s", exc)
        return {"rejected": str(exc)}


@dispatcher_task(names.WARM_UP, pipeline=True, max_retries=None)
def warm_up(self: Any, net_name: str) -> str:
    """Bring the prewarmed net's server up and mark it READY; poll every READY_POLL_S until
    it is, or until its readiness deadline."""
    rt = runtime()
    result = prewarm_warm_up.warm_up(rt, net_name)
    if result.step == prewarm_warm_up.Warm.NOT_READY:
        raise self.retry(countdown=rt.settings.ready_poll_s, max_retries=None)
    return str(result.step)

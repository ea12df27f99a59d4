"""Refused prewarms (tasks/README.md "Prewarm", **Refusals**): their reason code, and the
row that records one (a lookup of its key finds it for REJECTED_RETENTION_S); a refusal
starts nothing and takes no key. It spends a cancel kept for its key (`early_cancels`)."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import delete, select

from app.db import unit_of_work
from app.errors import CallerKeyConflict, InvalidRequest, NetDrained, NetMisconfigured
from app.runtime import Runtime
from app.schemas import recorded_caller_key, storable
from app.usecases.prewarm import early_cancels
from models import Prewarm, PrewarmOutcome

log = logging.getLogger("app.usecases.prewarm")


def refusal_code(exc: InvalidRequest) -> PrewarmOutcome:
    """The reason code of a refused prewarm."""
    if isinstance(exc, CallerKeyConflict):
        return PrewarmOutcome.CALLER_KEY_CONFLICT
    if isinstance(exc, NetMisconfigured):
        return PrewarmOutcome.NET_MISCONFIGURED
    if isinstance(exc, NetDrained):
        return PrewarmOutcome.NET_DRAINED
    return PrewarmOutcome.REJECTED


def refuse_prewarm(rt: Runtime, caller_key: str | None, exc: InvalidRequest) -> PrewarmOutcome:
    """Record a refused prewarm (one log line, and a row a lookup of its key finds for
    REJECTED_RETENTION_S); it starts nothing and takes no key. Returns its reason code."""
    code = refusal_code(exc)
    key = recorded_caller_key(caller_key) if caller_key is not None else ""
    reason = storable(str(exc))[:4000]
    log.warning("prewarm refused", extra={"caller_key": key, "reason": reason, "code": str(code)})
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        if key and key == caller_key:  # a key a prewarm may have: the cancel kept for it is spent
            early_cancels.lock(session, key)
            early_cancels.take(session, key, now)
        # Refusals are kept for REJECTED_RETENTION_S (once counted), as refused enqueues are.
        session.execute(
            delete(Prewarm).where(
                Prewarm.refused,
                Prewarm.counted,
                Prewarm.created_at < now - timedelta(seconds=rt.settings.rejected_retention_s),
            )
        )
        net = getattr(exc, "net_name", None)
        kept = select(Prewarm.id).where(
            Prewarm.refused, Prewarm.caller_key == key, Prewarm.outcome == code
        )
        if key and session.scalar(kept.where(Prewarm.detail == reason).limit(1)) is not None:
            return code  # the same refusal again (a retry after a lost commit reply): kept
        session.add(
            Prewarm(
                caller_key=key,
                net_name=net if rt.settings.has_net(net) else None,
                required_sites=[],
                created_at=now,
                hold_until=now,
                ended_at=now,
                outcome=code,
                refused=True,
                detail=reason,
            )
        )
    return code

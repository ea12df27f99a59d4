"""A scale-down call is leased: reconcile does not finish a stop (and so let a job claim the
net and start it) while the worker that decided it may still be calling the platform; a
call that lands after its net was claimed anyway (the worker was frozen past the lease)
puts the replica back as soon as it reads the net again, and a stop that finds its net
claimed before the call makes no call at all. Neither a stray's expiry nor a worker's start
(which puts a MISCONFIGURED net back in service) finishes a stop whose call may still land."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.adapters.drivers.base import Observation
from app.errors import AdminMisconfigured, UnknownAdminError
from app.usecases import declared_nets, dispatch, reconciler, records, scale_down, scaling
from app.usecases.dispatch import Step
from app.usecases.scaling import stop_net
from models import JobState, NetState, ReasonCode
from tests.fakes import FakeAdmin
from tests.unit.conftest import World
from tests.unit.scale_down_race import idle_past_grace, on_first_scale_down
from tests.unit.scale_history import scale_decisions


def _stop_finished_and_net_claimed(world: World) -> str:
    """What a frozen worker misses: reconcile finished its stop, and a job (a new one, or
    the oldest waiting) claimed the net and had it scaled up. That job's id."""
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a", lock=True).transition(
            NetState.STOPPED, world.clock(), "stop finished by reconcile"
        )
    world.enqueue("next", net="net-a")
    assignment = next(a for a in dispatch.claim_and_start(world.rt) if a.net_name == "net-a")
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
                records.abort_job(session, claimed[0], "flip-api: stop", world.clock())
                records.get_net(session, "net-a", lock=True).transition(
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
        records.get_net(session, "net-a", lock=True).transition(
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
        records.get_net(session, "net-a", lock=True).transition(
            NetState.STOPPING, world.clock(), "idle"
        )
    job_id = _stop_finished_and_net_claimed(world)  # the worker paused before its call
    calls = list(world.driver("net-a").calls)

    assert stop_net(world.rt, "net-a", "idle grace passed") is False

    assert world.driver("net-a").calls == calls
    assert world.driver("net-a").replicas == 1
    assert world.job(job_id).state == JobState.ASSIGNED


def test_a_stop_finished_by_another_before_its_lease_makes_no_call(world, monkeypatch):
    """Simulation seed 8160 (drift): the worker that moved net-a to STOPPING paused before
    its lease; reconcile finished the stop (its own lease, its call, STOPPED); the worker
    then leased a STOPPED net, and a claim took the net while its call was on the wire: the
    scale-to-0 landed under an ASSIGNED job. A net already STOPPED wants no call."""
    idle_past_grace(world)
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a", lock=True).transition(
            NetState.STOPPING, world.clock(), "idle"
        )
    assert stop_net(world.rt, "net-a", "settling STOPPING")  # reconcile, meanwhile
    assert world.net("net-a").state == NetState.STOPPED
    world.enqueue("next", net="net-a")
    claimed: list[str] = []
    on_first_scale_down(
        world,
        monkeypatch,
        lambda: claimed.extend(a.job_id for a in dispatch.claim_and_start(world.rt)),
    )
    calls = list(world.driver("net-a").calls)

    assert stop_net(world.rt, "net-a", "idle grace passed") is False  # the paused worker

    assert world.driver("net-a").calls == calls
    assert claimed == []  # nothing was on the wire for a claim to race


def _stopping_with_call_in_flight(world: World) -> None:
    """net-a is STOPPING, its worker's scale-to-0 call leased now and not landed yet."""
    idle_past_grace(world)
    with world.rt.sessions.begin() as session:
        net = records.get_net(session, "net-a", lock=True)
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
        records.get_net(session, "net-a", lock=True).transition(
            NetState.STOPPING, world.clock(), "idle"
        )
    job_id = _stop_finished_and_net_claimed(world)  # the worker paused before its call
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.DONE
    with world.rt.sessions.begin() as session:
        records.finish_job(
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
    assignment = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
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


# --- the lease against a stray's expiry and a restart ----------------------------------------


def _claim_and_scale_up(world: World, key: str) -> tuple[str | None, int]:
    """A job tries to claim net-a and have its server scaled up: its id (None when the net
    could not be claimed), and how many driver calls were made up to then."""
    job_id = world.enqueue(key, net="net-a")
    assignment = next((a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id), None)
    if assignment is None:
        return None, len(world.driver("net-a").calls)
    step = dispatch.scale_up(world.rt, job_id, "net-a", assignment.attempt)
    assert step.step.name == "DONE"
    return job_id, len(world.driver("net-a").calls)


def test_a_stray_expiry_does_not_finish_a_stop_whose_call_may_still_land(world, monkeypatch):
    """app/usecases/README.md: reconcile finishes a STOPPING net's stop only once its lease
    has passed (or the call returned), "so the net cannot be stopped, claimed and started
    again while the first call may still land"; only a worker frozen LONGER than
    STUCK_AFTER_S may land late.

    Here the idle stop's call is on the wire for 2 s (its lease runs 300 s). The same
    reconcile round that leaves the STOPPING net alone (`_stop_in_flight`) goes on to its
    stray runs: one unsettled for ABORT_TIMEOUT_S gets the net taken down
    (`expire_stray_runs` -> `take_down` -> `stop_net`), which never looks at the lease,
    records STOPPED and lets a job claim the net and start it. The first call then lands on
    the claimed job's server."""
    # The job that ran there left a run its server would not settle (a stray), 299 s ago.
    done = idle_past_grace(world, idle_s=0)
    world.add_stray(done, "net-a", "nv-stray")
    world.clock.advance(world.rt.settings.abort_timeout_s - 1)

    def unsettled(_admin: FakeAdmin, _run: str) -> None:
        raise UnknownAdminError("an nvflare error nobody classified")

    # Every admin session (stop_net drops the one it had) gets that answer for the stray.
    monkeypatch.setattr(FakeAdmin, "abort", unsettled)
    seen: dict[str, object] = {}

    def meanwhile() -> None:
        world.clock.advance(2)  # 2 s into a call leased for STUCK_AFTER_S
        reconciler.reconcile(world.rt)
        seen["state after reconcile"] = world.net("net-a").state
        seen["job"], seen["calls"] = _claim_and_scale_up(world, "claimer")

    on_first_scale_down(world, monkeypatch, meanwhile)

    scale_down.scale_down_idle_nets(world.rt)

    after_claim = world.driver("net-a").calls[seen["calls"] :]  # type: ignore[misc]
    assert seen["job"] is None or 0 not in after_claim, (
        f"the first scale-to-0 landed after job {seen['job']} claimed the net and scaled it"
        f" up (driver calls after its scale-up: {after_claim})"
    )
    assert seen["state after reconcile"] == NetState.STOPPING, (
        "reconcile finished a stop whose call was still in flight (lease live)"
    )
    assert seen["job"] is None  # nothing can claim the net while a stop's call may land


def test_a_misconfigured_net_reset_at_start_does_not_let_its_leased_stop_land_on_a_job(
    world, monkeypatch
):
    """app/usecases/README.md: the net "cannot be stopped, claimed and started again while
    the first call may still land". A net found misconfigured is scaled down
    (`scale_down_or_log`, leased); while that call is on the wire a rolling deploy starts a
    process, whose `sync_nets` resets every MISCONFIGURED net to STOPPED ("a restart after a
    fix is the human saying try again") without looking at the lease. The requeued job
    claims the net at once and scales it up; the first call then lands on it."""
    job_id = world.enqueue("victim", net="net-a")
    assignment = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    net, attempt = assignment.net_name, assignment.attempt
    assert dispatch.scale_up(world.rt, job_id, net, attempt).step.name == "DONE"
    real_is_ready = FakeAdmin.is_ready

    def expired(_admin: FakeAdmin, _sites: object) -> None:
        raise AdminMisconfigured("admin certificate expired")

    monkeypatch.setattr(FakeAdmin, "is_ready", expired)
    seen: dict[str, object] = {}

    def meanwhile() -> None:
        world.clock.advance(2)  # 2 s into a call leased for STUCK_AFTER_S
        monkeypatch.setattr(FakeAdmin, "is_ready", real_is_ready)  # the new process's fix
        with world.rt.sessions.begin() as session:
            declared_nets.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
        seen["state"] = world.net(net).state
        again = next((a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id), None)
        if again is not None:
            assert dispatch.scale_up(world.rt, job_id, net, again.attempt).step.name == "DONE"
        seen["claimed"] = again is not None
        seen["calls"] = len(world.driver(net).calls)

    on_first_scale_down(world, monkeypatch, meanwhile)

    with pytest.raises(AdminMisconfigured):
        dispatch.check_ready(world.rt, job_id, net, attempt)

    after_claim = world.driver(net).calls[seen["calls"] :]  # type: ignore[misc]
    assert not seen["claimed"] or 0 not in after_claim, (
        f"the misconfigured net's scale-to-0 landed after job {job_id} claimed it again and"
        f" scaled it up (net {seen['state']} when claimed; driver calls since: {after_claim})"
    )
    # The new process left the net STOPPING while the call may land; once the lease has
    # passed, reconcile finishes the stop and the requeued job claims the net.
    assert seen["state"] == NetState.STOPPING
    assert world.job(job_id).state == JobState.QUEUED
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    reconciler.reconcile(world.rt)
    assert [a.job_id for a in dispatch.claim_and_start(world.rt)] == [job_id]

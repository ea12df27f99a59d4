"""Adversarial review of round 4 (the scale-down lease, submit tokens after requeues, the
monitor's dead-run rule): reproductions of promises the change does not keep. Each test
fails on the code it was written against; see the report on branch review4."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from app.errors import AdminMisconfigured, UnknownAdminError
from app.usecases import dispatch, reconciler, scale_down, services
from models import JobEvent, JobState, NetState
from tests.fakes import FakeAdmin
from tests.unit.conftest import World
from tests.unit.scale_down_race import idle_past_grace, on_first_scale_down


def _claim_and_scale_up(world: World, key: str) -> tuple[str | None, int]:
    """A job tries to claim net-a and have its server scaled up: its id (None when the net
    could not be claimed), and how many driver calls were made up to then."""
    job_id = world.enqueue(key, net="net-a")
    assignment = next((a for a in dispatch.assign_jobs(world.rt) if a.job_id == job_id), None)
    if assignment is None:
        return None, len(world.driver("net-a").calls)
    step = dispatch.scale_up(world.rt, job_id, "net-a", assignment.attempt)
    assert step.step.name == "DONE"
    return job_id, len(world.driver("net-a").calls)


# --- 1. the lease is honoured by reconcile's own repair, but not by its stray expiry ------


def test_a_stray_expiry_does_not_finish_a_stop_whose_call_may_still_land(world, monkeypatch):
    """README: reconcile finishes a STOPPING net's stop only once its lease has passed (or
    the call returned), "so the net cannot be stopped, claimed and started again while the
    first call may still land"; only a worker frozen LONGER than STUCK_AFTER_S may land late.

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


# --- 2. a submit token reused after a requeue, with history written before migration 0004 --


def test_a_second_dispatch_at_one_attempt_gets_a_new_token_with_history_before_0004(world):
    """README: "each dispatch's submit token must be new, even when a requeue counted no
    attempt" (services.dispatches_of), and a requeued job on a server that kept its job
    store must not be answered with the earlier run (models.Job.start_dispatch).

    A job that spent an attempt on a readiness timeout was dispatched at attempt 1 before
    migration 0004 (its DISPATCHING row has attempt NULL), its net was then found
    misconfigured (a requeue that counts no attempt), and it is dispatched again at attempt
    1. `start_dispatch` keeps "the older rule" for such history (`len(earlier) > attempts`,
    1 > 1 is false) and hands out `<id>-1` a second time: the server, which kept its job
    store, answers with the first dispatch's run (one killed with its process), which the
    job adopts instead of starting a run of its own."""
    job_id = world.enqueue("requeued-twice", net="net-a")
    with world.rt.sessions.begin() as session:
        services.get_job(session, job_id).attempts = 1  # a readiness timeout spent one
    net, attempt = world.run_until_ready(job_id)
    with world.rt.sessions.begin() as session:
        earlier = services.dispatches_of(session, job_id)
        first = services.get_job(session, job_id).start_dispatch(world.clock(), earlier=earlier)
    server = world.server(net)
    landed = world.admin(net).submit(world.rt.settings.job_root, first)  # the submit landed
    server.submit_error = AdminMisconfigured("admin certificate expired")
    with pytest.raises(AdminMisconfigured):
        dispatch.dispatch(world.rt, job_id, net, attempt)  # the retry meets the bad kit
    assert world.job(job_id).state == JobState.QUEUED
    assert world.job(job_id).attempts == attempt  # not the job's fault: no attempt counted
    with world.rt.sessions.begin() as session:
        # That history was written before migration 0004: its rows know no attempt.
        session.execute(update(JobEvent).where(JobEvent.job_id == job_id).values(attempt=None))
    # A human fixes the kit; the server had gone to zero with the run (its job store kept).
    server.submit_error = None
    server.restart()
    with world.rt.sessions.begin() as session:
        services.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
    reconciler.reconcile(world.rt)  # the stray died with the server: forgotten

    net, again = world.run_until_ready(job_id)
    assert again == attempt
    dispatch.dispatch(world.rt, job_id, net, again)

    second = world.job(job_id).submit_token
    assert second != first, f"dispatch at attempt {again} reused submit token {first}"
    assert world.job(job_id).nvflare_job_id != landed, "adopted the earlier dispatch's run"


# --- 3. a MISCONFIGURED net put back in service while its scale-down is on the wire -------


def test_a_misconfigured_net_reset_at_start_does_not_let_its_leased_stop_land_on_a_job(
    world, monkeypatch
):
    """README: the net "cannot be stopped, claimed and started again while the first call
    may still land". A net found misconfigured is scaled down (`scale_down_or_log`, leased);
    while that call is on the wire a rolling deploy starts a process, whose `sync_nets`
    resets every MISCONFIGURED net to STOPPED ("a restart after a fix is the human saying
    try again") without looking at the lease. The requeued job claims the net at once and
    scales it up; the first call then lands on it."""
    job_id = world.enqueue("victim", net="net-a")
    assignment = next(a for a in dispatch.assign_jobs(world.rt) if a.job_id == job_id)
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
            services.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
        seen["state"] = world.net(net).state
        again = next((a for a in dispatch.assign_jobs(world.rt) if a.job_id == job_id), None)
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
    assert [a.job_id for a in dispatch.assign_jobs(world.rt)] == [job_id]


# --- 4. the dead-run rule on a server whose clock was stepped back -------------------------

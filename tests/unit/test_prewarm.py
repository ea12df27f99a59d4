"""Prewarm (README "Prewarm"): a net's server brought up on flip-api's hint and held ready
until the hint's deadline (at most PREWARM_MAX_S), then released to the normal idle grace;
idempotent per caller key, cancellable, refused for a MISCONFIGURED net, never a second
replica, never a hold past its deadline whatever message is lost."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import timedelta

import pytest
from sqlalchemy import select

from app import names
from app.adapters.drivers.base import Observation
from app.errors import (
    CallerKeyConflict,
    InvalidRequest,
    NetMisconfigured,
    NotFound,
    RequestRejected,
)
from app.handlers import HANDLERS, Verdict, on_error
from app.schemas import PrewarmNet
from app.settings import Settings
from app.usecases import dispatch, prewarm, prewarm_warm_up, reconciler, scale_down, services
from app.usecases.prewarm_warm_up import Warm
from models import JobState, NetEvent, NetState, Prewarm, PrewarmOutcome, ReasonCode
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of
from tests.unit.lost_commit_reply import commit_reply_lost
from tests.unit.scale_history import scale_decisions

GRACE_S = 60
READY_TIMEOUT_S = 120
MAX_S = 600


@pytest.fixture
def pw(tmp_path, job_root, sqlite_factory, clock) -> World:
    """Two scale-to-zero nets (grace 60 s) with sites; net-c has only site-3; a static one."""
    nets = [
        net_decl(
            tmp_path,
            name,
            "ecs",
            idle_timeout_s=GRACE_S,
            ready_timeout_s=READY_TIMEOUT_S,
            sites=["site-1", "site-2"],
        )
        for name in ("net-a", "net-b")
    ]
    nets.append(
        net_decl(
            tmp_path, "net-c", "ecs", idle_timeout_s=GRACE_S, sites=["site-3"], required_sites=[]
        )
    )
    nets.append(net_decl(tmp_path, "fixed", "static", sites=["site-9"], required_sites=[]))
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, PREWARM_MAX_S=MAX_S)


def ask(world: World, key: str, **kw) -> prewarm.Requested:
    return prewarm.request_prewarm(world.rt, PrewarmNet(caller_key=key, **kw))


def warm_sent(world: World) -> list[str]:
    return [kw["net_name"] for task, kw in world.outbox.sent if task == names.WARM_UP]


def warm_until_ready(world: World, net: str) -> None:
    """What the warm_up task does: poll until the net is READY."""
    for _ in range(5):
        if prewarm_warm_up.warm_up(world.rt, net).step == Warm.READY:
            return
    raise AssertionError("never ready")


def row(world: World, key: str, *, refused: bool | None = None) -> Prewarm:
    """The key's accepted prewarm if any, else its latest refusal."""
    stmt = select(Prewarm).where(Prewarm.caller_key == key)
    if refused is not None:
        stmt = stmt.where(Prewarm.refused.is_(refused))
    with world.rt.sessions() as session:
        return session.scalars(stmt.order_by(Prewarm.refused, Prewarm.id.desc())).first()


def view(world: World, key: str) -> dict:
    with world.rt.sessions() as session:
        return prewarm.get_prewarm(session, key, world.clock())


def starts(world: World, net: str) -> int:
    with world.rt.sessions() as session:
        return len(
            session.scalars(
                select(NetEvent).where(
                    NetEvent.net_name == net, NetEvent.to_state == NetState.STARTING
                )
            ).all()
        )


def held_ready(world: World, key: str = "p1", within_s: float = 300, net: str = "net-a"):
    """A prewarm of `net` whose server is up and READY (held)."""
    answer = ask(world, key, net=net, within_s=within_s)
    if answer.notified:
        warm_until_ready(world, net)
    assert world.net(net).state == NetState.READY
    return answer


def moved_ready(world: World, net: str = "net-a") -> None:
    """The STARTING net moved READY by another's readiness check (a job's chain, whose sites
    may differ from the holds', or reconcile's)."""
    with world.rt.sessions.begin() as session:
        services.get_net(session, net).transition(NetState.READY, world.clock(), "ready")


def finish(world: World, job_id) -> None:
    with world.rt.sessions.begin() as session:
        services.finish_job(
            session,
            job_id,
            JobState.COMPLETED,
            "done",
            world.clock(),
            code=ReasonCode.RUN_COMPLETED,
        )


# --- scale-up -------------------------------------------------------------------------------


def test_a_prewarm_starts_a_stopped_net_through_the_scale_up_path_and_holds_it_ready(pw):
    answer = ask(pw, "p1", net="net-a", within_s=300)
    assert answer.created and answer.notified is True
    assert answer.prewarm["status"] == "warming" and answer.prewarm["net"] == "net-a"
    assert answer.prewarm["required_sites"] == ["site-1", "site-2"]  # the net's default
    assert pw.net("net-a").state == NetState.STARTING
    assert warm_sent(pw) == ["net-a"]

    first = prewarm_warm_up.warm_up(pw.rt, "net-a")
    assert first.step == Warm.NOT_READY and pw.driver("net-a").calls == [1]
    assert scale_decisions(pw, "net-a") == [(1, "prewarm: a job is likely soon")]
    driver = pw.driver("net-a")
    booted = driver.observe
    driver.observe = lambda: Observation(desired=1, running=0, pending=1)  # still booting
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    driver.observe = booted
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.READY
    net = pw.net("net-a")
    assert net.state == NetState.READY and net.idle_since == pw.clock()
    assert view(pw, "p1")["status"] == "held" and row(pw, "p1").ready_at == pw.clock()
    assert pw.driver("net-a").calls == [1]  # one ask of the driver, however many polls


def test_readiness_waits_for_the_sites_the_hint_names(pw):
    ask(pw, "p1", net="net-a", required_sites=["site-1"], within_s=300)
    pw.server("net-a").sites = ["site-2"]
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    pw.server("net-a").sites = ["site-1"]
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.READY


@pytest.mark.parametrize(
    "not_ready", ["sites", "server"], ids=["sites-not-connected", "server-not-answering"]
)
def test_reconcile_leaves_a_prewarmed_net_starting_until_its_server_is_ready(pw, not_ready):
    ask(pw, "p1", net="net-a", within_s=300)
    prewarm_warm_up.warm_up(pw.rt, "net-a")  # the driver was asked: its replica runs
    if not_ready == "sites":
        pw.server("net-a").sites = ["site-1"]
    else:
        pw.server("net-a").up = False
    pw.clock.advance(2)
    reconciler.reconcile(pw.rt)  # STARTING without a job, driver up, server not ready yet
    assert pw.net("net-a").state == NetState.STARTING and row(pw, "p1").ready_at is None
    pw.server("net-a").sites, pw.server("net-a").up = ["site-1", "site-2"], True
    pw.clock.advance(5)
    reconciler.reconcile(pw.rt)  # ready now: reconcile may say so
    net = pw.net("net-a")
    assert net.state == NetState.READY and row(pw, "p1").ready_at == pw.clock()
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.SKIPPED  # nothing left to wait


def test_reconcile_starts_the_idle_grace_of_a_prewarmed_net_at_its_hold_end(pw):
    ask(pw, "p1", net="net-a", within_s=30)
    prewarm_warm_up.warm_up(pw.rt, "net-a")  # the driver was asked; its later polls are lost
    hold_until = row(pw, "p1").hold_until
    pw.clock.advance(40)  # the server came up late, after its hold ended
    reconciler.reconcile(pw.rt)
    net = pw.net("net-a")
    assert net.state == NetState.READY and net.idle_since == hold_until
    pw.clock.now = hold_until + timedelta(seconds=GRACE_S - 1)
    assert scale_down.scale_down_idle_nets(pw.rt) == []
    pw.clock.advance(1)  # hold end + grace: no fresh grace from the late READY
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]


def test_a_misconfiguration_seen_while_a_ready_net_awaits_its_sites_fails_the_hold(pw, monkeypatch):
    from app.errors import AdminMisconfigured

    ask(pw, "p1", net="net-a", within_s=300)
    pw.server("net-a").sites = []
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    moved_ready(pw)  # READY, its hold still waits for its sites

    def misconfigured(sites):
        raise AdminMisconfigured("admin kit names another server")

    monkeypatch.setattr(pw.admin("net-a"), "is_ready", misconfigured)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.GAVE_UP
    assert pw.net("net-a").state == NetState.MISCONFIGURED
    assert (pw.driver("net-a").replicas, view(pw, "p1")["status"]) == (0, "failed")


def test_a_net_moved_ready_while_its_readiness_was_checked_still_notes_it(pw, monkeypatch):
    ask(pw, "p1", net="net-a", within_s=300)
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    admin = pw.admin("net-a")
    real = admin.is_ready

    def moved_meanwhile(sites):
        moved_ready(pw)
        return real(sites)

    monkeypatch.setattr(admin, "is_ready", moved_meanwhile)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.READY
    assert row(pw, "p1").ready_at == pw.clock()


def test_no_second_replica_and_one_cold_start_however_many_hints_and_jobs(pw):
    ask(pw, "p1", net="net-a", within_s=300)
    again = ask(pw, "p2", net="net-a", within_s=200)  # another hint while it starts
    assert again.created and again.notified is None  # nothing to start: it is starting
    warm_until_ready(pw, "net-a")
    ask(pw, "p3", net="net-a", within_s=100)  # and one while it is up
    job_id = pw.enqueue("job", net="net-a")
    [claim] = dispatch.assign_jobs(pw.rt)
    assert claim.net_state == NetState.READY
    assert dispatch.start(pw.rt, job_id, "net-a", 0).step.value == "dispatched"  # warm path
    assert pw.job(job_id).state == JobState.RUNNING
    assert pw.driver("net-a").calls == [1]  # the job's scale-up found the server up
    assert starts(pw, "net-a") == 1
    assert warm_sent(pw) == ["net-a"]


def test_a_job_claimed_while_the_server_starts_takes_it_over_without_a_second_start(pw):
    ask(pw, "p1", net="net-a", within_s=300)
    prewarm_warm_up.warm_up(pw.rt, "net-a")  # the driver was asked
    job_id = pw.enqueue("job", net="net-a")
    [claim] = dispatch.assign_jobs(pw.rt)  # the STARTING net is claimed, not started again
    assert claim.net_state == NetState.STARTING
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.SKIPPED  # the job's chain owns it
    # The chain's scale-up asks the driver for the same one replica.
    assert dispatch.scale_up(pw.rt, job_id, "net-a", 0).step.value == "done"
    assert pw.driver("net-a").replicas == 1 and starts(pw, "net-a") == 1


def test_a_driver_failure_from_before_the_start_was_asked_is_an_earlier_servers(pw):
    driver = pw.driver("net-a")
    driver.failure = "container exited on its own with code 1"  # how the last server ended
    ask(pw, "p1", net="net-a", within_s=300)
    first = prewarm_warm_up.warm_up(pw.rt, "net-a")
    assert first.step == Warm.NOT_READY and driver.calls == [1]  # started, not given up on
    assert pw.net("net-a").state == NetState.STARTING
    driver.replicas = 0  # the server this start asked for ended the same way: its failure
    failed = prewarm_warm_up.warm_up(pw.rt, "net-a")
    assert failed.step == Warm.GAVE_UP and "code 1" in failed.detail
    assert pw.net("net-a").state == NetState.UNHEALTHY


def test_a_net_past_its_readiness_deadline_is_unhealthy_and_its_hold_failed(pw):
    ask(pw, "p1", net="net-a", within_s=300)
    pw.server("net-a").up = False  # the server never answers
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    pw.clock.advance(READY_TIMEOUT_S)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    pw.clock.advance(1)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.GAVE_UP
    assert pw.net("net-a").state == NetState.UNHEALTHY
    assert pw.driver("net-a").replicas == 0
    assert view(pw, "p1")["status"] == "failed"


def test_a_server_that_answers_without_every_site_by_the_deadline_is_ready_all_the_same(pw):
    ask(pw, "p1", net="net-a", within_s=300)
    pw.server("net-a").sites = ["site-1"]
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    pw.clock.advance(READY_TIMEOUT_S + 1)
    result = prewarm_warm_up.warm_up(pw.rt, "net-a")
    assert result.step == Warm.READY and "site-2" in result.detail
    assert pw.net("net-a").state == NetState.READY


def test_misconfiguration_seen_while_warming_fails_the_hold(pw):
    from app.errors import DriverMisconfigured

    ask(pw, "p1", net="net-a", within_s=300)
    pw.driver("net-a").fail_with = DriverMisconfigured("no such service")
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.GAVE_UP
    assert pw.net("net-a").state == NetState.MISCONFIGURED
    assert view(pw, "p1")["status"] == "failed"


# --- the hold and its bound -----------------------------------------------------------------


def test_an_idle_net_is_held_until_the_deadline_then_stopped_after_its_grace(pw):
    held_ready(pw, within_s=300)
    pw.clock.advance(300 + GRACE_S - 1)
    assert scale_down.scale_down_idle_nets(pw.rt) == []  # held, then in its grace
    assert pw.net("net-a").state == NetState.READY
    pw.clock.advance(1)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]
    assert pw.net("net-a").state == NetState.STOPPED
    assert view(pw, "p1")["status"] == "expired"
    assert row(pw, "p1").outcome == PrewarmOutcome.EXPIRED  # written down by the round


def test_a_hint_longer_than_prewarm_max_s_is_held_only_that_long(pw):
    answer = held_ready(pw, within_s=5000)
    assert "PREWARM_MAX_S" in answer.prewarm["detail"]
    pw.clock.advance(MAX_S + GRACE_S - 1)
    assert scale_down.scale_down_idle_nets(pw.rt) == []
    pw.clock.advance(1)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]


def test_the_hold_outlives_no_lost_message_nor_a_settling_that_never_runs(pw, monkeypatch):
    """The deadline is read from SQL by the idle check itself: with every settling round
    failing (and the warm-up's last message lost), the server still goes at T + grace."""
    held_ready(pw, within_s=300)

    def broken(*_):
        raise RuntimeError("worker died")

    monkeypatch.setattr(prewarm_warm_up, "settle_row", broken)
    pw.clock.advance(300 + GRACE_S)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]
    assert row(pw, "p1").outcome is None  # never settled, yet not held past its deadline


def test_a_job_on_a_held_net_ends_the_hold_and_its_own_end_starts_the_grace(pw):
    held_ready(pw, within_s=1000)
    pw.clock.advance(10)
    job_id = pw.enqueue("job", net="net-a")
    pw.run_pipeline(job_id)
    pw.clock.advance(10)
    finish(pw, job_id)
    pw.clock.advance(GRACE_S - 1)
    assert scale_down.scale_down_idle_nets(pw.rt) == []
    settled = row(pw, "p1")
    assert settled.outcome == PrewarmOutcome.USED and settled.job_id == job_id
    pw.clock.advance(1)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]  # not held to 1000 s


def test_the_claim_itself_ends_the_hold_as_used_naming_the_job(pw):
    """In the claim's own transaction, before any settling round: used, at the claim, by
    that job, and saying so."""
    held_ready(pw, within_s=1000)
    job_id = pw.enqueue("job", net="net-a")
    dispatch.assign_jobs(pw.rt)
    used = row(pw, "p1")
    assert (used.outcome, used.job_id, used.ended_at) == (PrewarmOutcome.USED, job_id, pw.clock())
    assert used.detail == f"job {job_id} was claimed onto the net"


def test_a_claim_after_the_deadline_leaves_the_hold_to_expire(pw):
    """A hold past its deadline that no round has settled yet was not used by a job
    claimed after it: it expired."""
    held_ready(pw, within_s=100)
    pw.enqueue("late", net="net-a")
    pw.clock.now = row(pw, "p1").hold_until + timedelta(seconds=1)
    assert dispatch.assign_jobs(pw.rt)
    assert row(pw, "p1").outcome is None
    prewarm_warm_up.settle_prewarms(pw.rt)
    ended = row(pw, "p1")
    assert (ended.outcome, ended.job_id) == (PrewarmOutcome.EXPIRED, None)


def test_a_hold_is_live_up_to_its_deadline_excluded(pw):
    """A hold is live on [created_at, hold_until): a job claimed a moment before the deadline
    used it, from the claim on (claims._use_holds, no read in between shows it expired)."""
    held_ready(pw, within_s=100)
    job_id = pw.enqueue("on-time", net="net-a")
    pw.clock.now = row(pw, "p1").hold_until - timedelta(microseconds=1)
    assert dispatch.assign_jobs(pw.rt)
    assert view(pw, "p1")["status"] == "used"
    prewarm_warm_up.settle_prewarms(pw.rt)
    used = row(pw, "p1")
    assert (used.outcome, used.job_id, used.ended_at) == (PrewarmOutcome.USED, job_id, pw.clock())


def test_a_job_claimed_at_the_deadline_instant_finds_the_hold_expired(pw):
    """At hold_until itself the hold has ended: status_of reads it expired, and neither the
    claim nor a settling round afterwards turns it into used (one rule for the instant)."""
    held_ready(pw, within_s=100)
    pw.enqueue("late", net="net-a")
    deadline = row(pw, "p1").hold_until
    pw.clock.now = deadline
    assert view(pw, "p1")["status"] == "expired"
    assert dispatch.assign_jobs(pw.rt)
    assert view(pw, "p1")["status"] == "expired"
    prewarm_warm_up.settle_prewarms(pw.rt)
    ended = row(pw, "p1")
    assert (ended.outcome, ended.job_id, ended.ended_at) == (PrewarmOutcome.EXPIRED, None, deadline)


def test_a_claim_keeps_the_outcome_of_a_hold_that_ended_before_it(pw):
    """A cancelled hold (its deadline still ahead) stays cancelled: a job claimed onto the
    net after the cancel did not use it."""
    held_ready(pw, within_s=1000)
    pw.clock.advance(10)
    cancelled_at = pw.clock()
    prewarm.cancel_prewarm(pw.rt, "p1")
    pw.enqueue("after", net="net-a")
    assert dispatch.assign_jobs(pw.rt)
    kept = row(pw, "p1")
    assert (kept.outcome, kept.job_id, kept.ended_at) == (
        PrewarmOutcome.CANCELLED,
        None,
        cancelled_at,
    )


def test_a_busy_net_is_held_after_its_job_until_the_deadline(pw):
    job_id = pw.enqueue("before", net="net-a")
    pw.run_pipeline(job_id)
    pw.clock.advance(1)
    ask(pw, "p1", net="net-a", within_s=300)  # the hint is for the next job
    assert view(pw, "p1")["status"] == "held"
    pw.clock.advance(100)
    finish(pw, job_id)
    pw.clock.advance(200 + GRACE_S - 1)  # to the hint's deadline, and its grace
    assert scale_down.scale_down_idle_nets(pw.rt) == []
    # The running job was claimed before the hint: it did not use it.
    assert row(pw, "p1").outcome == PrewarmOutcome.EXPIRED
    pw.clock.advance(1)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]


def test_a_net_a_live_hold_finds_down_is_started_again(pw):
    held_ready(pw, within_s=600)
    with pw.rt.sessions.begin() as session:  # the server went away (found gone, taken down)
        services.get_net(session, "net-a").transition(NetState.STOPPED, pw.clock(), "gone")
    pw.driver("net-a").replicas = 0
    scale_down.scale_down_idle_nets(pw.rt)
    assert pw.net("net-a").state == NetState.STARTING
    assert warm_sent(pw) == ["net-a", "net-a"]


def test_a_lost_warm_up_is_sent_again_after_stuck_after_s(pw):
    ask(pw, "p1", net="net-a", within_s=600)  # its warm_up message is lost
    assert scale_down.scale_down_idle_nets(pw.rt) == []
    assert warm_sent(pw) == ["net-a"]
    pw.clock.advance(pw.rt.settings.stuck_after_s + 1)
    scale_down.scale_down_idle_nets(pw.rt)
    assert warm_sent(pw) == ["net-a", "net-a"]
    prewarm_warm_up.warm_up(pw.rt, "net-a")  # the re-sent one asks the driver: no more re-sends
    pw.clock.advance(pw.rt.settings.stuck_after_s + 1)
    scale_down.scale_down_idle_nets(pw.rt)
    assert warm_sent(pw) == ["net-a", "net-a"]


# --- idempotency ----------------------------------------------------------------------------


def test_the_same_request_again_names_the_same_prewarm_and_starts_no_second_server(pw):
    ask(pw, "p1", net="net-a", within_s=300)
    pw.clock.advance(5)
    again = ask(pw, "p1", net="net-a", within_s=300, required_sites=["site-2", "site-1"])
    assert not again.created
    assert again.prewarm["created_at"] == row(pw, "p1").created_at.isoformat()
    assert starts(pw, "net-a") == 1
    # Still STARTING: the warm-up is sent again (the first send may have been lost with a
    # commit's reply); warm_up is idempotent. Once the net is READY, a repeat sends nothing.
    assert again.notified and warm_sent(pw) == ["net-a", "net-a"]
    warm_until_ready(pw, "net-a")
    assert ask(pw, "p1", net="net-a", within_s=300).notified is None


def test_a_prewarm_retried_after_its_commit_reply_was_lost_still_starts_its_server(pw):
    """flip-api's prewarm is stored (net STARTING, hold live) but the commit's reply is lost,
    so the warm_up it would send never goes out; the task is retried (the database could not
    confirm it). The retry must carry the request out as if handled at once: the warm_up is
    sent now, not by the scale-down round's lost-warm_up repair STUCK_AFTER_S later."""
    handler = HANDLERS[names.PREWARM]
    payload = {"caller_key": "p1", "net": "net-a", "within_s": 120}
    with commit_reply_lost(pw.rt.engine), pytest.raises(Exception) as lost:
        handler.call(pw.rt, payload=payload)
    assert on_error(handler, lost.value, 0, pw.rt.settings) is Verdict.RETRY
    assert pw.net("net-a").state == NetState.STARTING  # the commit was applied
    assert warm_sent(pw) == []
    pw.clock.advance(2)  # the retry's backoff
    handler.call(pw.rt, payload=payload)
    assert warm_sent(pw) == ["net-a"]


def test_an_identical_repeat_after_a_redeploy_changed_the_nets_sites_names_the_same_prewarm(
    pw, tmp_path
):
    """The repeat omits required_sites, as the first did; a redeploy meanwhile changed the
    net's required_sites: the same request, never a caller_key_conflict."""
    ask(pw, "p1", net="net-a", within_s=300)
    nets = [
        net_decl(tmp_path, "net-a", "ecs", sites=["site-1", "site-2"], required_sites=["site-1"])
    ]
    redeployed = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=pw.rt.settings.job_root,
        NETS=json.dumps(nets),
    )
    rt = dataclasses.replace(pw.rt, settings=redeployed)
    again = prewarm.request_prewarm(rt, PrewarmNet(caller_key="p1", net="net-a", within_s=300))
    assert not again.created and again.prewarm["caller_key"] == "p1"
    with pytest.raises(CallerKeyConflict, match="required_sites"):
        prewarm.request_prewarm(
            rt, PrewarmNet(caller_key="p1", net="net-a", within_s=300, required_sites=["site-1"])
        )


def test_a_repeat_omitting_the_sites_the_prewarm_named_explicitly_is_a_conflict(pw):
    """Omitted sites are the net's (site-1 and site-2): a prewarm asked for site-1 alone is
    not what a payload without required_sites asks for, so that repeat is refused as a
    caller_key_conflict, as an enqueue's is."""
    ask(pw, "p1", net="net-a", within_s=300, required_sites=["site-1"])
    with pytest.raises(CallerKeyConflict):
        ask(pw, "p1", net="net-a", within_s=300)


def test_another_payload_under_the_key_is_a_conflict_that_changes_nothing(pw):
    ask(pw, "p1", net="net-a", within_s=300)
    with pytest.raises(CallerKeyConflict, match="within_s"):
        ask(pw, "p1", net="net-a", within_s=900)
    with pytest.raises(CallerKeyConflict, match="net"):
        ask(pw, "p1", net="net-b", within_s=300)
    assert pw.net("net-b").state == NetState.STOPPED
    assert view(pw, "p1")["hold_until"] == row(pw, "p1").hold_until.isoformat()
    assert view(pw, "p1")["within_s"] == 300  # the accepted one is what the key names
    refused = row(pw, "p1", refused=True)
    assert refused.outcome == PrewarmOutcome.CALLER_KEY_CONFLICT


def test_a_repeat_of_an_ended_prewarm_does_not_start_it_again(pw):
    held_ready(pw, within_s=100)
    pw.clock.advance(100 + GRACE_S)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]
    again = ask(pw, "p1", net="net-a", within_s=100)
    assert not again.created and again.prewarm["status"] == "expired"
    assert pw.net("net-a").state == NetState.STOPPED


# --- cancel ---------------------------------------------------------------------------------


def test_a_cancel_ends_the_hold_now_and_the_grace_starts_then(pw):
    held_ready(pw, within_s=600)
    pw.clock.advance(100)
    cancelled = prewarm.cancel_prewarm(pw.rt, "p1")
    assert cancelled["status"] == "cancelled" and cancelled["ended_at"] == pw.clock().isoformat()
    pw.clock.advance(GRACE_S - 1)
    assert scale_down.scale_down_idle_nets(pw.rt) == []
    pw.clock.advance(1)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]  # not at 600 s + grace
    assert prewarm.cancel_prewarm(pw.rt, "p1")["status"] == "cancelled"  # harmless repeat


def test_a_cancel_keeps_the_outcome_of_a_prewarm_that_ended(pw):
    held_ready(pw, within_s=100)
    pw.clock.advance(101)
    assert prewarm.cancel_prewarm(pw.rt, "p1")["status"] == "expired"
    held_ready(pw, key="p2", within_s=500)
    pw.run_pipeline(pw.enqueue("job", net="net-a"))
    assert prewarm.cancel_prewarm(pw.rt, "p2")["status"] == "used"


def test_cancelling_an_unknown_or_refused_prewarm_says_so(pw):
    with pytest.raises(NotFound):
        prewarm.cancel_prewarm(pw.rt, "nope")
    with pytest.raises(InvalidRequest):
        ask(pw, "bad", net="net-z", within_s=60)
    with pytest.raises(RequestRejected) as refused:
        prewarm.cancel_prewarm(pw.rt, "bad")
    assert refused.value.reason_code == "rejected"


# --- refusals -------------------------------------------------------------------------------


def test_a_prewarm_for_a_misconfigured_net_is_refused_and_starts_nothing(pw):
    with pw.rt.sessions.begin() as session:
        services.mark_misconfigured(session, "net-a", "admin kit names another server", pw.clock())
    with pytest.raises(NetMisconfigured, match="MISCONFIGURED: admin kit names another server"):
        ask(pw, "p1", net="net-a", within_s=300)
    assert pw.driver("net-a").calls == [] and pw.net("net-a").state == NetState.MISCONFIGURED
    with pytest.raises(RequestRejected) as looked_up:
        view(pw, "p1")
    assert looked_up.value.reason_code == "net_misconfigured"
    assert row(pw, "p1").net_name == "net-a"  # in the net's prewarm history
    # Fixed and restarted: the same key is a new request now (a refusal takes no key).
    with pw.rt.sessions.begin() as session:
        services.sync_nets(session, pw.rt.settings, pw.clock(), at_start=True)
    assert ask(pw, "p1", net="net-a", within_s=300).created


def test_sites_whose_every_net_is_misconfigured_are_refused_as_such(pw):
    with pw.rt.sessions.begin() as session:
        services.mark_misconfigured(session, "net-c", "expired certificate", pw.clock())
    with pytest.raises(NetMisconfigured, match="every net with the sites"):
        ask(pw, "p1", required_sites=["site-3"], within_s=60)
    assert row(pw, "p1").outcome == PrewarmOutcome.NET_MISCONFIGURED


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"net": "net-z"}, "unknown net 'net-z' (known: net-a, net-b, net-c, fixed)"),
        ({"net": "net-a", "required_sites": ["site-3"]}, "required sites ['site-3'] are not on"),
        ({"required_sites": ["site-1", "site-3"]}, "no net has every site"),
        ({}, "required_sites is empty and no net is given"),
    ],
)
def test_bad_input_is_refused_as_an_enqueue_refuses_it_and_recorded(pw, kw, words):
    with pytest.raises(InvalidRequest, match=re.escape(words)):
        ask(pw, "p1", within_s=60, **kw)
    assert row(pw, "p1").outcome == PrewarmOutcome.REJECTED
    assert all(pw.net(n).state == NetState.STOPPED for n in ("net-a", "net-b", "net-c"))


# --- which net ------------------------------------------------------------------------------


def test_sites_resolve_to_the_net_a_job_would_be_claimed_on(pw):
    held_ready(pw, key="warm", net="net-b", within_s=600)
    prewarm.cancel_prewarm(pw.rt, "warm")  # net-b READY and free, no hold on it
    assert ask(pw, "p1", required_sites=["site-1"], within_s=60).prewarm["net"] == "net-b"
    # net-b is held by p1 now: the next hint for those sites starts net-a for its own job
    second = ask(pw, "p2", required_sites=["site-1"], within_s=60)
    assert second.prewarm["net"] == "net-a" and second.notified is True
    assert ask(pw, "p3", required_sites=["site-3"], within_s=60).prewarm["net"] == "net-c"


def test_an_always_on_net_is_only_held(pw):
    answer = ask(pw, "p1", net="fixed", within_s=60)
    assert answer.created and answer.notified is None and "always-on" in answer.prewarm["detail"]


# --- visibility -----------------------------------------------------------------------------


def test_status_metrics_and_the_nets_page_show_the_hold(pw):
    from app.entrypoints.nets_page import render
    from app.metrics.read import read_snapshot
    from app.usecases.net_history import declared_nets, nets_overview
    from app.usecases.views import collect_status

    held_ready(pw, within_s=300)
    pw.clock.advance(GRACE_S * 2)  # past the grace since READY: held, so not idle
    status = collect_status(pw.rt, None, 1.0)
    [net_a] = [n for n in status["nets"] if n["name"] == "net-a"]
    assert net_a["prewarm"] == {
        "caller_key": "p1",
        "hold_until": row(pw, "p1").hold_until.isoformat(),
        "status": "held",
    }
    assert all(n["prewarm"] is None for n in status["nets"] if n["name"] != "net-a")
    with pw.rt.sessions.begin() as session:
        snap = read_snapshot(session, pw.clock(), idle_grace_s={"net-a": GRACE_S})
        page = nets_overview(session, declared_nets(pw.rt.settings), pw.clock())
    assert snap.prewarm_held_nets == 1 and snap.idle_s["net-a"] == 0
    [panel] = [p for p in page.nets if p.now.name == "net-a"]
    assert panel.now.hold is not None and panel.now.idle_left_s == GRACE_S
    assert not panel.now.needs_attention  # held, not "idle past its grace"
    html = render(page)
    assert '<dt>Prewarm</dt><dd><span class="key">p1</span> held until 12:05 (3m 00s left)' in html

    pw.clock.advance(300)
    scale_down.scale_down_idle_nets(pw.rt)
    with pytest.raises(InvalidRequest):
        ask(pw, "bad", net="net-z", within_s=1)
    with pw.rt.sessions.begin() as session:
        snap = read_snapshot(session, pw.clock())
    assert snap.prewarm_held_nets == 0
    assert snap.prewarms["expired"] == 1 and snap.prewarms["rejected"] == 1
    assert sum(snap.prewarms.values()) == 2


def test_the_moves_a_prewarm_causes_are_in_the_nets_history(pw):
    held_ready(pw, within_s=120)
    with pw.rt.sessions() as session:
        reasons = [
            e.reason
            for e in session.scalars(
                select(NetEvent).where(NetEvent.net_name == "net-a").order_by(NetEvent.id)
            )
        ]
    assert reasons[-2:] == ["prewarm p1: a job is likely within 120s", "ready for its prewarm"]

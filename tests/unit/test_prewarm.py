"""Prewarm's holds (tasks/README.md "Prewarm"): a net's server brought up on flip-api's hint
and held ready until the hint's deadline (at most PREWARM_MAX_S), then released to the
normal idle grace; never a second replica, never a hold past its deadline whatever message
is lost, nor a server kept past the bound however late it boots; a claim ends the hold it
uses, and status, metrics and the nets page show what is held. What a request is answered:
test_prewarm_requests.py; the doors: test_prewarm_doors.py; a job naming its hint:
test_prewarm_key.py; the simulator's prewarms: test_prewarm_sim.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from app.adapters.drivers.base import Observation
from app.errors import DriverMisconfigured, InvalidRequest
from app.metrics.read import read_snapshot
from app.schemas import PrewarmNet
from app.usecases import dispatch, prewarm, reconciler, records, scale_down
from app.usecases.prewarm import warm_up as prewarm_warm_up
from app.usecases.prewarm.warm_up import Warm
from app.usecases.views import collect_status
from models import JobState, NetEvent, NetState, PrewarmOutcome
from tests.unit.prewarm_world import (
    GRACE_S,
    MAX_S,
    READY_TIMEOUT_S,
    ROUND_S,
    ask,
    boot_slowly,
    finish,
    held_ready,
    moved_ready,
    pw,
    row,
    starts,
    view,
    warm_sent,
    warm_until_ready,
)
from tests.unit.scale_history import scale_decisions

__all__ = ["pw"]  # the fixture, used by name


# --- scale-up -------------------------------------------------------------------------------


def test_a_prewarm_starts_a_stopped_net_through_the_scale_up_path_and_holds_it_ready(pw):
    answer = ask(pw, "p1", net="net-a", within_s=300)
    assert answer.created and answer.notified is True
    assert answer.prewarm.status == "warming" and answer.prewarm.net == "net-a"
    assert answer.prewarm.required_sites == ["site-1", "site-2"]  # the net's default
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
    assert view(pw, "p1").status == "held" and row(pw, "p1").ready_at == pw.clock()
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
    assert (pw.driver("net-a").replicas, view(pw, "p1").status) == (0, "failed")


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
    [claim] = dispatch.claim_and_start(pw.rt)
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
    [claim] = dispatch.claim_and_start(pw.rt)  # the STARTING net is claimed, not started again
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
    assert view(pw, "p1").status == "failed"


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
    assert view(pw, "p1").status == "failed"


def test_a_misconfiguration_seen_by_warm_up_never_strands_a_job_claimed_meanwhile(pw):
    """tasks/README.md: "a job claimed meanwhile takes the net over with its own chain".
    warm_up reads "no job" without the row lock, then the driver says misconfigured: it
    marks the net MISCONFIGURED and scales it to 0 with job_id=None, so the job claimed in
    between is left ASSIGNED on a MISCONFIGURED, scaled-down net (a job's own step would
    requeue it), and the hold that job used is written `failed`."""
    ask(pw, "p1", net="net-a", within_s=300)
    job_id = pw.enqueue("job", net="net-a")
    driver = pw.driver("net-a")
    real_observe = driver.observe

    def claimed_then_misconfigured():
        driver.observe = real_observe
        dispatch.claim_and_start(pw.rt)  # the job is claimed onto the STARTING net meanwhile
        raise DriverMisconfigured("no such service")

    driver.observe = claimed_then_misconfigured
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    job, net = pw.job(job_id), pw.net("net-a")
    assert not (job.state == JobState.ASSIGNED and net.state == NetState.MISCONFIGURED), (
        "job left ASSIGNED on a MISCONFIGURED net the prewarm scaled to 0"
    )
    assert row(pw, "p1").outcome == PrewarmOutcome.USED


def test_a_warm_up_whose_holds_all_ended_before_it_asked_the_driver_releases_the_net(pw):
    """The warm-up's message arrives after its only hold was cancelled: it asks the driver
    for nothing and takes the STARTING net down, so no server comes up for no hold."""
    ask(pw, "p1", net="net-a", within_s=600)
    pw.clock.advance(5)
    prewarm.cancel_prewarm(pw.rt, "p1")
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.SKIPPED
    assert (pw.net("net-a").state, pw.driver("net-a").replicas) == (NetState.STOPPED, 0)
    assert 1 not in pw.driver("net-a").calls
    assert row(pw, "p1").outcome == PrewarmOutcome.CANCELLED


# --- the hold and its bound -----------------------------------------------------------------


def test_an_idle_net_is_held_until_the_deadline_then_stopped_after_its_grace(pw):
    held_ready(pw, within_s=300)
    pw.clock.advance(300 + GRACE_S - 1)
    assert scale_down.scale_down_idle_nets(pw.rt) == []  # held, then in its grace
    assert pw.net("net-a").state == NetState.READY
    pw.clock.advance(1)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]
    assert pw.net("net-a").state == NetState.STOPPED
    assert view(pw, "p1").status == "expired"
    assert row(pw, "p1").outcome == PrewarmOutcome.EXPIRED  # written down by the round


def test_a_hint_longer_than_prewarm_max_s_is_held_only_that_long(pw):
    answer = held_ready(pw, within_s=5000)
    assert "PREWARM_MAX_S" in answer.prewarm.detail
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
    dispatch.claim_and_start(pw.rt)
    used = row(pw, "p1")
    assert (used.outcome, used.job_id, used.ended_at) == (PrewarmOutcome.USED, job_id, pw.clock())
    assert used.detail == f"job {job_id} was claimed onto the net"


def test_a_claim_after_the_deadline_leaves_the_hold_to_expire(pw):
    """A hold past its deadline that no round has settled yet was not used by a job
    claimed after it: it expired."""
    held_ready(pw, within_s=100)
    pw.enqueue("late", net="net-a")
    pw.clock.now = row(pw, "p1").hold_until + timedelta(seconds=1)
    assert dispatch.claim_and_start(pw.rt)
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
    assert dispatch.claim_and_start(pw.rt)
    assert view(pw, "p1").status == "used"
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
    assert view(pw, "p1").status == "expired"
    assert dispatch.claim_and_start(pw.rt)
    assert view(pw, "p1").status == "expired"
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
    assert dispatch.claim_and_start(pw.rt)
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
    assert view(pw, "p1").status == "held"
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
        records.get_net(session, "net-a").transition(NetState.STOPPED, pw.clock(), "gone")
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


def test_a_short_hint_whose_server_boots_late_is_released_at_within_s_plus_grace(pw):
    """tasks/README.md: "a prewarm with no job releases the server at within_s + the net's
    idle_timeout_s". Here the hold ends at 10 s; the server answers at 100 s and is then
    marked READY with a fresh idle_since, so it is kept up to 160 s instead of 70 s."""
    ask(pw, "p1", net="net-a", within_s=10)
    boot_slowly(pw, "net-a", 100)
    pw.clock.advance(ROUND_S)  # t = 101 > 10 + 60 + a round
    scale_down.scale_down_idle_nets(pw.rt)
    assert pw.driver("net-a").replicas == 0, (
        f"server still up at within_s + grace + a round; net is {pw.net('net-a').state}"
    )


def test_a_hold_restarted_near_its_deadline_is_released_at_prewarm_max_s_plus_grace(pw):
    """tasks/README.md: "nothing, not a lost message nor a dead worker, keeps a server up past
    PREWARM_MAX_S + the grace (plus one scale-down round)". A held server found gone at
    590 s is started again for a hold ending at 600 s; it answers at 690 s and is kept up
    until 750 s (> 600 + 60 + a round)."""
    held_ready(pw, within_s=5000)  # capped to MAX_S = 600
    pw.clock.advance(MAX_S - 10)
    with pw.rt.sessions.begin() as session:  # the server went away under the hold
        records.get_net(session, "net-a").transition(NetState.STOPPED, pw.clock(), "gone")
    pw.driver("net-a").replicas = 0
    scale_down.scale_down_idle_nets(pw.rt)  # the hold wants it up: started again
    assert pw.net("net-a").state == NetState.STARTING
    boot_slowly(pw, "net-a", 100)  # t = 690
    pw.clock.advance(ROUND_S)
    scale_down.scale_down_idle_nets(pw.rt)
    assert pw.driver("net-a").replicas == 0, (
        f"server still up at 691 s, past PREWARM_MAX_S + grace + a round (661 s); "
        f"net is {pw.net('net-a').state}"
    )


def test_lowering_prewarm_max_s_shortens_the_holds_already_granted(pw):
    """tasks/README.md: a prewarm never keeps a server up past PREWARM_MAX_S. An operator who lowers
    it (a redeploy) bounds the holds granted before as well, from the next scale-down round."""
    held_ready(pw, "p1", within_s=MAX_S)
    pw.rt.settings = pw.rt.settings.model_copy(update={"prewarm_max_s": 30.0})
    pw.clock.advance(30 + GRACE_S + ROUND_S)

    scale_down.scale_down_idle_nets(pw.rt)

    assert row(pw, "p1").outcome == PrewarmOutcome.EXPIRED
    assert pw.net("net-a").state == NetState.STOPPED


def test_a_used_prewarm_is_never_reported_expired(pw):
    """tasks/README.md: "an ended prewarm keeps its outcome". A job claimed at 10 s used the hold;
    read after the 100 s deadline but before a scale-down round, GET answers `expired`; after
    the round the same prewarm answers `used`."""
    held_ready(pw, within_s=100)
    pw.clock.advance(10)
    job_id = pw.enqueue("job", net="net-a")
    pw.run_pipeline(job_id)
    pw.clock.advance(100)
    before = view(pw, "p1").status
    scale_down.scale_down_idle_nets(pw.rt)
    after = view(pw, "p1").status
    assert (before, after) == ("used", "used")


def test_an_expired_hold_is_not_rewritten_failed_by_a_late_give_up(pw):
    """tasks/README.md: "an ended prewarm keeps its outcome". A 30 s hold whose server never answers
    reads `expired` at 31 s; at the readiness deadline the warm-up's give-up rewrites every
    open row, this expired one included, as `failed` (and the counter counts it failed)."""
    ask(pw, "p1", net="net-a", within_s=30)
    pw.server("net-a").up = False
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    pw.clock.advance(31)
    assert view(pw, "p1").status == "expired"
    pw.clock.advance(READY_TIMEOUT_S)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.GAVE_UP
    assert (view(pw, "p1").status, row(pw, "p1").outcome) == ("expired", "expired")


def test_a_hint_made_just_after_a_claim_is_not_used_by_that_claim(pw):
    """tasks/README.md "Prewarm": a hold ends "when a job is claimed onto its net"; a job claimed
    before the hint did not use it (test_a_busy_net_is_held_after_its_job_until_the_deadline).
    The claim itself ends the holds open at that moment (claims._use_holds); a hint that
    arrives after the claim, at the same instant, is not among them and must stay held for
    the next job. prewarm_holds.settle_row counts a job assigned at the hold's creation
    instant (`assigned_at >= created_at`) as its use: the hint ends at once, `used` by a job
    that was claimed before it existed, and the net is let go after that job's grace
    instead of being held to the hint's deadline."""
    job_id = pw.enqueue("before", net="net-a")
    assert dispatch.claim_and_start(pw.rt)  # claimed at T: net-a STARTING for it
    prewarm.request_prewarm(pw.rt, PrewarmNet(caller_key="p1", net="net-a", within_s=300))
    assert row(pw, "p1").outcome is None  # the claim came first: it did not end this hold
    prewarm_warm_up.settle_prewarms(pw.rt)  # a scale-down round, still at T
    settled = row(pw, "p1")
    assert (settled.outcome, settled.job_id) == (None, None), (
        f"a hint made after job {job_id}'s claim was settled {settled.outcome} by it"
    )


def test_a_prewarm_read_as_expired_at_its_deadline_never_reads_used_after(pw):
    """tasks/README.md "Prewarm": `status` is warming/held, "then used, expired, cancelled or
    failed": an ended prewarm keeps its outcome. At the hold's deadline instant T,
    GET /prewarms (prewarm.status_of: `hold_until <= now`) already reads it `expired`; a
    claim at that same T once ended it `used` (claims._use_holds had `hold_until >= now`),
    so a caller that read `expired` read `used` a moment later at the same clock. One rule
    now: a hold is live on [created_at, hold_until)."""
    held_ready(pw, within_s=100)
    pw.enqueue("on-time", net="net-a")
    pw.clock.now = row(pw, "p1").hold_until
    before = view(pw, "p1").status
    assert dispatch.claim_and_start(pw.rt)
    after = view(pw, "p1").status
    assert after == before, f"read {before!r} at its deadline, then {after!r} at the same instant"


# --- visibility -----------------------------------------------------------------------------


def test_status_metrics_and_the_nets_page_show_the_hold(pw):
    from app.entrypoints.nets_page import render
    from app.metrics.read import read_snapshot
    from app.usecases.net_history import nets_as_declared, nets_overview
    from app.usecases.views import collect_status

    held_ready(pw, within_s=300)
    pw.clock.advance(GRACE_S * 2)  # past the grace since READY: held, so not idle
    status = collect_status(pw.rt, None, 1.0)
    [net_a] = [n for n in status.nets if n.name == "net-a"]
    assert net_a.prewarm is not None
    assert net_a.prewarm.model_dump() == {
        "caller_key": "p1",
        "hold_until": row(pw, "p1").hold_until.isoformat(),
        "status": "held",
    }
    assert all(n.prewarm is None for n in status.nets if n.name != "net-a")
    with pw.rt.sessions.begin() as session:
        snap = read_snapshot(session, pw.clock(), idle_grace_s={"net-a": GRACE_S})
        page = nets_overview(session, nets_as_declared(pw.rt.settings), pw.clock())
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


def test_a_hold_a_job_took_is_not_shown_held_while_the_job_runs(pw):
    """tasks/README.md: a hold ends "when a job is claimed onto its net (used)", and /fl/status and
    fl_dispatcher_prewarm_held_nets show *live* holds. Until the next scale-down round, the
    prewarm's GET says `held`, /fl/status shows the hold and the gauge counts it."""
    held_ready(pw, within_s=600)
    pw.clock.advance(10)
    job_id = pw.enqueue("job", net="net-a")
    pw.run_pipeline(job_id)  # the job was claimed onto the held net
    assert pw.job(job_id).state == JobState.RUNNING
    status = collect_status(pw.rt, None, 1.0)
    [net_a] = [n for n in status.nets if n.name == "net-a"]
    with pw.rt.sessions() as session:
        snap = read_snapshot(session, pw.clock())
    shown = (view(pw, "p1").status, net_a.prewarm, snap.prewarm_held_nets)
    assert shown == ("used", None, 0)

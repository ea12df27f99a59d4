"""Adversarial review of the prewarm feature (README "Prewarm"): each test is a promise the
README makes that this code breaks. They fail on the code as reviewed; none is xfail."""

from __future__ import annotations

import pytest

from app.errors import DriverMisconfigured
from app.metrics.read import read_snapshot
from app.usecases import dispatch, prewarm, prewarm_warm_up, scale_down, services
from app.usecases.prewarm_warm_up import Warm
from app.usecases.views import collect_status
from models import JobState, NetState, PrewarmOutcome
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of
from tests.unit.test_prewarm import GRACE_S, READY_TIMEOUT_S, ask, held_ready, row, view

MAX_S = 600
# Any scale-down round after the bound: the README allows "plus one scale-down round".
ROUND_S = 1


@pytest.fixture
def pw(tmp_path, job_root, sqlite_factory, clock) -> World:
    """The nets of tests/unit/test_prewarm.py: scale-to-zero, grace 60 s, ready timeout 120 s."""
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
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, PREWARM_MAX_S=MAX_S)


def boot_slowly(world: World, net: str, boot_s: float) -> None:
    """The driver is asked for a replica now; the server answers only `boot_s` later (still
    inside the net's ready_timeout_s), polled by warm_up as its task does."""
    world.server(net).up = False
    assert prewarm_warm_up.warm_up(world.rt, net).step == Warm.NOT_READY  # driver asked
    world.clock.advance(boot_s)
    world.server(net).up = True
    assert prewarm_warm_up.warm_up(world.rt, net).step == Warm.READY


# --- the bound: within_s (<= PREWARM_MAX_S) + idle grace --------------------------------------


def test_review_a_short_hint_whose_server_boots_late_is_released_at_within_s_plus_grace(pw):
    """README: "a prewarm with no job releases the server at within_s + the net's
    idle_timeout_s". Here the hold ends at 10 s; the server answers at 100 s and is then
    marked READY with a fresh idle_since, so it is kept up to 160 s instead of 70 s."""
    ask(pw, "p1", net="net-a", within_s=10)
    boot_slowly(pw, "net-a", 100)
    pw.clock.advance(ROUND_S)  # t = 101 > 10 + 60 + a round
    scale_down.scale_down_idle_nets(pw.rt)
    assert pw.driver("net-a").replicas == 0, (
        f"server still up at within_s + grace + a round; net is {pw.net('net-a').state}"
    )


def test_review_a_hold_restarted_near_its_deadline_outlives_prewarm_max_s_plus_grace(pw):
    """README: "nothing, not a lost message nor a dead worker, keeps a server up past
    PREWARM_MAX_S + the grace (plus one scale-down round)". A held server found gone at
    590 s is started again for a hold ending at 600 s; it answers at 690 s and is kept up
    until 750 s (> 600 + 60 + a round)."""
    held_ready(pw, within_s=5000)  # capped to MAX_S = 600
    pw.clock.advance(MAX_S - 10)
    with pw.rt.sessions.begin() as session:  # the server went away under the hold
        services.get_net(session, "net-a").transition(NetState.STOPPED, pw.clock(), "gone")
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


def test_review_a_cancel_while_warming_starts_the_grace_at_the_cancel(pw):
    """README: "Cancellable: the hold ends now and the net's idle grace starts". Cancelled
    at 5 s while its server boots, the warm-up carries on, marks the net READY at 50 s with
    idle_since = 50 s, and the server is kept to 110 s instead of 65 s (+ a round)."""
    ask(pw, "p1", net="net-a", within_s=600)
    pw.server("net-a").up = False
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    pw.clock.advance(5)
    assert prewarm.cancel_prewarm(pw.rt, "p1")["status"] == "cancelled"
    pw.clock.advance(45)
    pw.server("net-a").up = True
    prewarm_warm_up.warm_up(pw.rt, "net-a")  # the warm_up task keeps polling after the cancel
    pw.clock.advance(GRACE_S - 45 + ROUND_S)  # t = 66: cancel + grace + a round
    scale_down.scale_down_idle_nets(pw.rt)
    assert pw.driver("net-a").replicas == 0, (
        f"server kept past cancel + grace; net is {pw.net('net-a').state}"
    )


# --- what status, history and metrics say -------------------------------------------------


def test_review_a_hold_a_job_took_is_not_shown_held_while_the_job_runs(pw):
    """README: a hold ends "when a job is claimed onto its net (used)", and /fl/status and
    fl_dispatcher_prewarm_held_nets show *live* holds. Until the next scale-down round, the
    prewarm's GET says `held`, /fl/status shows the hold and the gauge counts it."""
    held_ready(pw, within_s=600)
    pw.clock.advance(10)
    job_id = pw.enqueue("job", net="net-a")
    pw.run_pipeline(job_id)  # the job was claimed onto the held net
    assert pw.job(job_id).state == JobState.RUNNING
    status = collect_status(pw.rt, None, 1.0)
    [net_a] = [n for n in status["nets"] if n["name"] == "net-a"]
    with pw.rt.sessions() as session:
        snap = read_snapshot(session, pw.clock())
    shown = (view(pw, "p1")["status"], net_a["prewarm"], snap.prewarm_held_nets)
    assert shown == ("used", None, 0)


def test_review_a_used_prewarm_is_never_reported_expired(pw):
    """README: "an ended prewarm keeps its outcome". A job claimed at 10 s used the hold;
    read after the 100 s deadline but before a scale-down round, GET answers `expired`; after
    the round the same prewarm answers `used`."""
    held_ready(pw, within_s=100)
    pw.clock.advance(10)
    job_id = pw.enqueue("job", net="net-a")
    pw.run_pipeline(job_id)
    pw.clock.advance(100)
    before = view(pw, "p1")["status"]
    scale_down.scale_down_idle_nets(pw.rt)
    after = view(pw, "p1")["status"]
    assert (before, after) == ("used", "used")


def test_review_an_expired_hold_is_not_rewritten_failed_by_a_late_give_up(pw):
    """README: "an ended prewarm keeps its outcome". A 30 s hold whose server never answers
    reads `expired` at 31 s; at the readiness deadline the warm-up's give-up rewrites every
    open row, this expired one included, as `failed` (and the counter counts it failed)."""
    ask(pw, "p1", net="net-a", within_s=30)
    pw.server("net-a").up = False
    prewarm_warm_up.warm_up(pw.rt, "net-a")
    pw.clock.advance(31)
    assert view(pw, "p1")["status"] == "expired"
    pw.clock.advance(READY_TIMEOUT_S)
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.GAVE_UP
    assert (view(pw, "p1")["status"], row(pw, "p1").outcome) == ("expired", "expired")


# --- a job claimed meanwhile ------------------------------------------------------------------


def test_review_a_misconfiguration_seen_by_warm_up_never_strands_a_job_claimed_meanwhile(pw):
    """README: "a job claimed meanwhile takes the net over with its own chain". warm_up reads
    "no job" without the row lock, then the driver says misconfigured: it marks the net
    MISCONFIGURED and scales it to 0 with job_id=None, so the job claimed in between is left
    ASSIGNED on a MISCONFIGURED, scaled-down net (a job's own step would requeue it), and
    the hold that job used is written `failed`."""
    ask(pw, "p1", net="net-a", within_s=300)
    job_id = pw.enqueue("job", net="net-a")
    driver = pw.driver("net-a")
    real_observe = driver.observe

    def claimed_then_misconfigured():
        driver.observe = real_observe
        dispatch.assign_jobs(pw.rt)  # the job is claimed onto the STARTING net meanwhile
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


def test_lowering_prewarm_max_s_shortens_the_holds_already_granted(pw):
    """README: a prewarm never keeps a server up past PREWARM_MAX_S. An operator who lowers
    it (a redeploy) bounds the holds granted before as well, from the next scale-down round."""
    held_ready(pw, "p1", within_s=MAX_S)
    pw.rt.settings = pw.rt.settings.model_copy(update={"prewarm_max_s": 30.0})
    pw.clock.advance(30 + GRACE_S + ROUND_S)

    scale_down.scale_down_idle_nets(pw.rt)

    assert row(pw, "p1").outcome == PrewarmOutcome.EXPIRED
    assert pw.net("net-a").state == NetState.STOPPED

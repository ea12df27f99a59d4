"""reconcile's watch of always-on nets (PER_JOB_FL_SERVER off, or a static server): a
scalable net left down by scale-to-zero mode gets exactly one replica asked for, once; a
static server is never scaled; a reachable server brings a net that was left behind (or in
OUTAGE) back to READY, while a STARTING net with a job is left to its chain. A redeploy that
flips PER_JOB_FL_SERVER is settled from whatever state the net was in, and an always-on net
found at zero replicas clears the stray runs that died with its server."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from app.usecases import dispatch, monitor, reconciler, records
from app.usecases.dispatch import Step
from app.usecases.fleet import net_rows
from app.usecases.net_repairs import watch_always_on
from models import JobState, NetEvent, NetState, Prewarm, PrewarmOutcome, ReasonCode, StrayRun
from tests.fixtures.db import net_decl
from tests.unit.scale_history import scale_decisions


def _set_state(world, name: str, state: NetState) -> None:
    with world.rt.sessions.begin() as session:
        records.get_net(session, name).state = state


def _strays(world):
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def prewarmed_start(world) -> datetime:
    """net-a STARTING for a prewarm whose hold (60 s) was cancelled at 12 s: its start."""
    started = world.clock()
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").transition(NetState.STARTING, started, "prewarm")
        session.add(
            Prewarm(
                caller_key="pw-1",
                net_name="net-a",
                required_sites=[],
                created_at=started,
                hold_until=started + timedelta(seconds=60),
                ended_at=started + timedelta(seconds=12),
                outcome=PrewarmOutcome.CANCELLED,
            )
        )
    return started


def test_a_scalable_net_left_down_gets_one_replica_once(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    assert scale_decisions(world, "net-a") == [(1, "always-on net: one replica")]
    assert world.driver("net-a").replicas == 1
    assert world.net("net-a").state == NetState.READY
    reconciler.reconcile(world.rt)
    assert len(scale_decisions(world, "net-a")) == 1  # asked for already: not again


def test_a_net_left_down_whose_replica_is_already_asked_for_is_not_asked_again(always_on):
    world = always_on
    world.driver("net-a").replicas = 1  # desired 1, the net row still says STOPPED
    reconciler.reconcile(world.rt)
    assert scale_decisions(world, "net-a") == []
    assert world.net("net-a").state == NetState.READY


def test_a_static_server_is_never_scaled(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    assert scale_decisions(world, "fixed") == []
    assert world.net("fixed").state == NetState.READY


# (A job-less STARTING net at zero replicas is the dispatcher's own start left behind: it gets
# its replica, test_round14_breaks.py.)
@pytest.mark.parametrize("state", [NetState.READY, NetState.BUSY])
def test_a_net_that_is_up_is_not_scaled(always_on, state):
    world = always_on
    world.driver("net-a").replicas = 0
    _set_state(world, "net-a", state)
    reconciler.reconcile(world.rt)
    assert scale_decisions(world, "net-a") == []


def test_a_reachable_server_ends_an_outage(always_on):
    world = always_on
    world.server("fixed").up = False
    reconciler.reconcile(world.rt)
    assert world.net("fixed").state == NetState.OUTAGE
    world.server("fixed").up = True
    repaired = reconciler.reconcile(world.rt).repaired
    assert world.net("fixed").state == NetState.READY
    assert "fixed: OUTAGE -> READY" in repaired


def test_a_starting_net_with_a_job_is_left_to_its_chain(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    _set_state(world, "fixed", NetState.STARTING)
    job_id = world.enqueue("j", net="fixed")
    with world.rt.sessions.begin() as session:
        records.get_job(session, job_id).assign("fixed", world.clock())
    repaired = reconciler.reconcile(world.rt).repaired
    assert world.net("fixed").state == NetState.STARTING
    assert not [r for r in repaired if r.startswith("fixed")]
    assert world.job(job_id).state == JobState.ASSIGNED


def test_a_misconfigured_always_on_net_is_no_repair(always_on):
    world = always_on
    _set_state(world, "fixed", NetState.MISCONFIGURED)
    repaired = reconciler.reconcile(world.rt).repaired
    assert not [r for r in repaired if r.startswith("fixed")]
    assert world.net("fixed").state == NetState.MISCONFIGURED
    assert dispatch.claim_and_start(world.rt) == []


def _last_move(world, name: str):
    with world.rt.sessions() as session:
        e = session.scalars(
            select(NetEvent).where(NetEvent.net_name == name).order_by(NetEvent.id)
        ).all()[-1]
        return e.from_state, e.to_state, e.reason


def test_an_outage_under_a_running_job_ends_busy_and_says_why(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    world.server("fixed").up = False
    reconciler.reconcile(world.rt)
    assert _last_move(world, "fixed") == (
        NetState.BUSY,
        NetState.OUTAGE,
        "always-on server unreachable",
    )
    world.server("fixed").up = True
    reconciler.reconcile(world.rt)
    assert _last_move(world, "fixed") == (
        NetState.OUTAGE,
        NetState.BUSY,
        "always-on server reachable",
    )
    assert world.job(job_id).state == JobState.RUNNING


def test_a_healthy_always_on_net_is_no_repair(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    assert not [r for r in reconciler.reconcile(world.rt).repaired if r.startswith("fixed")]


def test_an_outage_ends_ready_when_its_job_ended_after_the_rounds_read(always_on):
    """The round reads every net once; a job that ended since (lost, aborted) must not
    leave its net BUSY with no job when the outage ends: the target is decided under the
    net's lock."""
    world = always_on
    reconciler.reconcile(world.rt)
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    _set_state(world, "fixed", NetState.OUTAGE)
    row = net_rows(world.rt)["fixed"]
    assert row.job_id == job_id
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session, job_id, JobState.FAILED, "lost", world.clock(), code=ReasonCode.SERVER_LOST
        )
    assert watch_always_on(world.rt, "fixed", row) == "OUTAGE -> READY"
    assert world.net("fixed").state == NetState.READY


def test_an_outage_that_ends_ready_counts_the_nets_idle_time_from_then(always_on):
    """The idle time the status API and the idle metric show (idle_since) starts when the
    server came back, not before the outage."""
    world = always_on
    reconciler.reconcile(world.rt)
    world.server("fixed").up = False
    reconciler.reconcile(world.rt)
    world.clock.advance(600)
    world.server("fixed").up = True
    reconciler.reconcile(world.rt)
    net = world.net("fixed")
    assert (net.state, net.idle_since) == (NetState.READY, world.clock())


def test_an_outage_another_round_ended_since_this_rounds_read_is_no_repair(always_on):
    world = always_on
    reconciler.reconcile(world.rt)
    world.server("fixed").up = False
    reconciler.reconcile(world.rt)
    row = net_rows(world.rt)["fixed"]  # this round reads OUTAGE ...
    world.server("fixed").up = True
    reconciler.reconcile(world.rt)  # ... and another round ends it first
    assert watch_always_on(world.rt, "fixed", row) == ""
    assert world.net("fixed").state == NetState.READY


@pytest.mark.parametrize("state", list(NetState))
@pytest.mark.parametrize("to_always_on", [True, False])
def test_a_flag_change_across_a_redeploy_is_legal_from_every_net_state(
    tmp_path, job_root, sqlite_factory, clock, state, to_always_on
):
    # tests/sim/FINDINGS.md, hole 8: PER_JOB_FL_SERVER flipped while the net was in any state.
    import json

    from app.settings import Settings
    from tests.unit.conftest import World

    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "net-a", "ecs")]),
        PER_JOB_FL_SERVER="false" if to_always_on else "true",
    )
    world = World(settings, sqlite_factory, clock)
    with world.rt.sessions.begin() as session:
        session.get(type(world.net("net-a")), "net-a").state = state
    world.driver("net-a").replicas = 1 if state in (NetState.READY, NetState.BUSY) else 0
    for _ in range(3):
        world.clock.advance(world.rt.settings.stuck_after_s + 1)
        reconciler.reconcile(world.rt)  # must not raise, whatever the state
    final = world.net("net-a").state
    if state == NetState.MISCONFIGURED:
        assert final == NetState.MISCONFIGURED
    elif to_always_on:
        assert final in (NetState.READY, NetState.OUTAGE, NetState.BUSY)
    else:
        assert final in (NetState.STOPPED, NetState.READY, NetState.BUSY)


def test_an_always_on_net_found_at_zero_replicas_releases_the_job_waiting_on_its_stray(
    tmp_path, job_root, sqlite_factory, clock
):
    # simulator seed 476 (chaos): an always-on net scaled to 0 by hand while its job ran; the
    # job was requeued with its run kept as a stray, and waited for ever although the run had
    # died with the server and another net was free.
    from tests.unit.conftest import world_of

    nets = [
        net_decl(tmp_path, "always", "ecs", per_job_fl_server=False),
        net_decl(tmp_path, "net-b", "ecs"),
    ]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    world.driver("always").replicas = 1
    reconciler.reconcile(world.rt)  # READY
    job_id = world.enqueue("j", required_sites=["site-1", "site-2"])
    world.run_pipeline(job_id)
    assert world.job(job_id).net_name == "always"
    world.driver("always").replicas = 0  # by hand: the server and its run are gone
    world.server("always").up = False
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)  # SERVER_LOST_ROUNDS: a second failed round
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED and len(_strays(world)) == 1
    assert dispatch.claim_and_start(world.rt) == []  # its own run may still go on: it waits
    reconciler.reconcile(world.rt)
    assert _strays(world) == []
    assert [a.net_name for a in dispatch.claim_and_start(world.rt)] == ["net-b"]


def test_a_prewarmed_start_found_up_idles_from_its_holds_end(always_on):
    """A net a prewarm started (STARTING, no job) whose hold was cancelled, then a redeploy to
    always-on: reconcile's READY idles from the hold's end, not from now, so a later redeploy
    back to scale-to-zero keeps it at most hold end + grace (simulator seed 4946)."""
    world = always_on
    started = prewarmed_start(world)
    world.driver("net-a").replicas = 1
    world.clock.advance(35)
    repaired = reconciler.reconcile(world.rt).repaired
    assert "net-a: STARTING without a job: now READY (idle)" in repaired
    net = world.net("net-a")
    assert net.state == NetState.READY
    assert net.idle_since == started + timedelta(seconds=12)


def test_a_prewarmed_start_found_up_is_ready_only_once_its_sites_are(always_on):
    """A net a prewarm started, found by reconcile after a redeploy to always-on: its server
    answering is not enough, its sites must be connected, as in scale-to-zero mode (simulator
    seed 8780: READY with no site connected)."""
    world = always_on
    started = world.clock()
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").transition(NetState.STARTING, started, "prewarm")
    world.driver("net-a").replicas = 1
    world.server("net-a").sites = []
    world.clock.advance(5)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.STARTING
    world.server("net-a").sites = ["site-1", "site-2"]
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.READY


def _start(world, name: str) -> None:
    """The net moves to STARTING now, with no job (a start scale-to-zero mode left behind)."""
    with world.rt.sessions.begin() as session:
        records.get_net(session, name).transition(NetState.STARTING, world.clock(), "prewarm")


@pytest.mark.parametrize("name", ["fixed", "net-a"])
def test_a_start_whose_server_never_comes_up_is_an_outage_past_the_readiness_deadline(
    always_on, name, caplog
):
    """A job-less STARTING always-on net whose server still does not answer past the net's
    ready_timeout_s (counted from its STARTING) is an OUTAGE, logged at error as the other
    one: an operator pages on OUTAGE, and a server that never comes up must page too. Before
    the deadline it is booting, not an outage; once it answers, the OUTAGE ends READY."""
    world = always_on
    world.driver("net-a").replicas = 1  # asked for already: the platform never brings it up
    world.server(name).up = False
    _start(world, name)
    deadline = world.rt.settings.net(name).ready_timeout_s
    world.clock.advance(deadline)
    assert not [r for r in reconciler.reconcile(world.rt).repaired if r.startswith(name)]
    assert world.net(name).state == NetState.STARTING
    world.clock.advance(1)
    with caplog.at_level("ERROR"):
        repaired = reconciler.reconcile(world.rt).repaired
    assert world.net(name).state == NetState.OUTAGE
    src, dst, reason = _last_move(world, name)
    assert (src, dst) == (NetState.STARTING, NetState.OUTAGE)
    assert f"not started {deadline + 1:.0f}s after STARTING" in reason
    assert f"ready_timeout_s {deadline:.0f}s" in reason
    assert f"{name}: STARTING -> OUTAGE" in " ".join(repaired)
    assert [r.net for r in caplog.records if r.levelname == "ERROR"] == [name]
    job_id = world.enqueue("j", net=name)
    assert dispatch.claim_and_start(world.rt) == []  # its job waits QUEUED meanwhile
    world.server(name).up = True
    assert f"{name}: OUTAGE -> READY" in reconciler.reconcile(world.rt).repaired
    assert world.net(name).state == NetState.READY
    assert [a.job_id for a in dispatch.claim_and_start(world.rt)] == [job_id]


def test_a_start_past_its_deadline_claimed_since_the_rounds_read_is_left_to_its_job(always_on):
    """The round read the STARTING net job-less; a job claimed onto it since owns its start
    (its wait_ready's deadline counts from the claim): decided under the row lock."""
    world = always_on
    world.server("fixed").up = False
    _start(world, "fixed")
    world.clock.advance(world.rt.settings.net("fixed").ready_timeout_s + 1)
    row = net_rows(world.rt)["fixed"]
    job_id = world.enqueue("j", net="fixed")
    with world.rt.sessions.begin() as session:
        records.get_job(session, job_id).assign("fixed", world.clock())
    assert watch_always_on(world.rt, "fixed", row) == ""
    assert world.net("fixed").state == NetState.STARTING


def test_a_start_with_a_job_whose_server_never_comes_up_is_an_outage_by_its_chain(always_on):
    """A STARTING always-on net that holds a job is left to the job's chain: its wait_ready
    gives the job up at the readiness deadline (from the claim), requeues it and marks the
    net OUTAGE itself; reconcile does not race it to that."""
    world = always_on
    world.server("fixed").up = False
    _start(world, "fixed")
    job_id = world.enqueue("j", net="fixed")
    with world.rt.sessions.begin() as session:
        records.get_job(session, job_id).assign("fixed", world.clock())
    world.clock.advance(world.rt.settings.net("fixed").ready_timeout_s + 1)
    assert not [r for r in reconciler.reconcile(world.rt).repaired if r.startswith("fixed")]
    assert world.net("fixed").state == NetState.STARTING
    assert dispatch.check_ready(world.rt, job_id, "fixed", 0).step == Step.GAVE_UP
    assert world.job(job_id).state == JobState.QUEUED
    assert world.net("fixed").state == NetState.OUTAGE


def test_a_job_claimed_onto_a_net_left_down_asks_for_its_one_replica(always_on):
    # Round 14 (helper's finding): a redeploy turned scale-to-zero off with net-a STOPPED at
    # zero replicas, and a job was claimed onto it before reconcile's watch asked for the
    # replica. Its scale_up said "always-on net: never scaled" and the watch leaves STARTING
    # alone: no replica ever, the job requeued at its readiness deadline, the net OUTAGE.
    world = always_on
    job_id = world.enqueue("j", net="net-a")
    [assignment] = dispatch.claim_and_start(world.rt)
    result = dispatch.scale_up(world.rt, job_id, "net-a", assignment.attempt)
    assert result.step == Step.DONE
    assert scale_decisions(world, "net-a") == [(1, "always-on net: one replica")]
    assert world.driver("net-a").replicas == 1
    dispatch.scale_up(world.rt, job_id, "net-a", assignment.attempt)  # a retried step
    assert len(scale_decisions(world, "net-a")) == 1  # asked for already: not again


def test_the_end_of_an_outage_is_logged_and_a_net_left_down_brought_back_is_not(always_on, caplog):
    """The WARNING "outage over" for the net that was in OUTAGE only: net-a, left STOPPED by
    scale-to-zero mode, comes back up too, without it."""
    world = always_on
    _set_state(world, "fixed", NetState.OUTAGE)
    _set_state(world, "net-a", NetState.STOPPED)
    with caplog.at_level("WARNING"):
        repaired = reconciler.reconcile(world.rt).repaired
    assert {"fixed: OUTAGE -> READY", "net-a: STOPPED -> READY"} <= set(repaired)
    assert [r.net for r in caplog.records if r.getMessage() == "outage over"] == ["fixed"]

"""Round 14's promises tried against the code (a break-it pass; each test failed on the
commit it was written against, f9f1393): the lost-server count (`Net.answered`,
`nets.unreachable_rounds`), the always-on start that never comes up (`outages.py`) and the
replica a job asks for on an always-on net left at zero (`dispatch._left_at_zero`)."""

from __future__ import annotations

from datetime import timedelta

from app.errors import ServerUnavailable
from app.usecases import dispatch, intake, monitor, reconciler, records
from models import JobState, NetState
from tests.unit.scale_history import scale_decisions
from tests.unit.test_always_on_watch import prewarmed_start


def _unreachable(world, net: str) -> None:
    def broken() -> float:
        raise ServerUnavailable("no route")

    world.admin(net).server_start_time = broken  # type: ignore[method-assign]


def _answers(world, net: str) -> None:
    world.admin(net).__dict__.pop("server_start_time", None)


def _a_later_job_gets_net_a_up(world) -> None:
    """Past its start's deadline, a job pinned to net-a comes: net-a's one replica is asked
    for (once) and the job's chain gets going."""
    world.clock.advance(world.rt.settings.net("net-a").ready_timeout_s + 1)
    reconciler.reconcile(world.rt)  # (now an OUTAGE, paging: `overdue_start`)
    waiting = world.enqueue("next", net="net-a")
    for _ in range(5):
        world.clock.advance(world.rt.settings.stuck_after_s)
        reconciler.reconcile(world.rt)
        if world.driver("net-a").replicas:
            world.server("net-a").up = True  # the replica asked for boots
        for claimed in dispatch.claim_and_start(world.rt):  # the chain's first step
            dispatch.scale_up(world.rt, claimed.job_id, claimed.net_name, claimed.attempt)
    assert [replicas for replicas, _ in scale_decisions(world, "net-a")] == [1]  # once
    assert world.job(waiting).state == JobState.ASSIGNED


def test_an_always_on_start_left_at_zero_replicas_is_not_an_outage_for_good(always_on):
    """An always-on ECS net STOPPED at zero replicas (the always_on world's start, or what
    scale-to-zero mode leaves across a redeploy) is claimed by a job before reconcile's
    watch asks for its replica; the job is aborted before its scale_up ran. The net is
    STARTING with no job and no replica asked for, which the watch never scales (STARTING is
    not "left down"). Past ready_timeout_s `overdue_start` makes it an OUTAGE, which the
    watch never scales either and no claim takes: the net pages for ever at zero replicas,
    and a job pinned to it that comes later waits for ever. (While it was STARTING a claim
    could take it and `_left_at_zero` ask for the replica; OUTAGE closed that door.)"""
    world = always_on
    world.server("net-a").up = False  # no replica: nothing answers
    job_id = world.enqueue("j", net="net-a")
    [assignment] = dispatch.claim_and_start(world.rt)
    assert (assignment.net_name, world.net("net-a").state) == ("net-a", NetState.STARTING)
    intake.request_abort(world.rt, job_id, "user")  # before the chain's scale_up ran
    assert world.job(job_id).state == JobState.ABORTED
    assert world.driver("net-a").replicas == 0
    _a_later_job_gets_net_a_up(world)


def test_an_answer_read_on_a_round_that_began_before_a_failure_restarts_the_count(world):
    """Two full rounds overlap (round A's calls wait as long as a beat interval): A reads
    the net answering (no failure pending); while its call waits, round B runs, its call
    fails and counts a round; then A's call is answered. A wrote nothing (`_monitor_net`:
    "a healthy busy net costs no transaction", judged on its own read), so the answer that
    came after the failure did not restart the count, and two more failed rounds the grace
    later lost the run: three failures with an answer among them, where
    `test_an_answer_between_failed_rounds_restarts_the_count` promises two rounds after an
    answer keep it. (A quiet round stays one read: only a round as long as half a beat
    interval clears, test_housekeeping_cost.py.)"""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    admin = world.admin("net-a")
    real = admin.server_start_time
    rounds: list[str] = []

    def slow_then_answered() -> float:
        if not rounds:  # round A's call: round B runs meanwhile, and fails
            rounds.append("A")
            world.clock.advance(world.rt.settings.housekeeping_interval_s)
            _unreachable(world, "net-a")
            monitor.monitor_running_jobs(world.rt)  # round B: one round counted
            assert world.net("net-a").unreachable_rounds == 1
            admin.server_start_time = slow_then_answered  # type: ignore[method-assign]
        return real()

    admin.server_start_time = slow_then_answered  # type: ignore[method-assign]
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "running"}  # A: answered
    _unreachable(world, "net-a")
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING  # two rounds since the answer


def test_an_always_on_server_reconcile_finds_back_restarts_the_count(always_on):
    """Any answer restarts the count: reconcile's always-on watch finds the busy net's
    server unreachable (BUSY -> OUTAGE), then answering (OUTAGE -> BUSY, "always-on server
    reachable"), between the monitor's failed rounds. `_back_up` moves the net back BUSY
    without `Net.answered`, so the failed round before the outage and two after it, the
    grace apart, lose a run whose server was seen answering in between."""
    world = always_on
    reconciler.reconcile(world.rt)  # READY
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    world.server("fixed").up = False
    monitor.monitor_running_jobs(world.rt)  # one failed round
    reconciler.reconcile(world.rt)
    assert world.net("fixed").state == NetState.OUTAGE
    world.server("fixed").up = True
    reconciler.reconcile(world.rt)
    assert world.net("fixed").state == NetState.BUSY  # the server answered
    world.server("fixed").up = False
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    monitor.monitor_running_jobs(world.rt)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING  # two rounds since the answer


def test_the_awaited_poll_beside_a_full_round_is_no_second_round(world):
    """Seed 6634's shape with a job waiting for the busy net: the beat tick that sends the
    full monitor round also sends the awaited-run poll (every second while a QUEUED job could
    take the net). Both find the server unreachable in the same second and each counts a
    round; no round runs for the grace (a sparse beat); the next full round fails too. Two
    failed full rounds the grace apart, and the run is lost on the one call made past the
    grace, the very "two failed calls the grace apart" SERVER_LOST_ROUNDS was to keep from
    requeuing a run (which may have completed meanwhile)."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.enqueue("waits", net="net-a")  # a QUEUED job the net's run holds back
    world.server("net-a").up = False
    monitor.monitor_awaited_runs(world.rt)  # the poll's call fails (f9f1393: rounds 1)
    monitor.monitor_running_jobs(world.rt)  # the full round, the same tick (rounds 2)
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)  # no round meanwhile
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING


def test_a_prewarmed_start_that_came_up_late_still_idles_from_its_holds_end(always_on):
    """Seed 4946's fix through the new OUTAGE: a net a prewarm started (STARTING, no job),
    its hold cancelled at 12 s, then a redeploy to always-on. Its server comes up only past
    ready_timeout_s: `overdue_start` made it an OUTAGE meanwhile, and the OUTAGE ends READY
    through `_back_up`, idle from now, where a STARTING found up (`_ready_once_ready`,
    `mark_ready`) idles from the hold's end: a redeploy back to scale-to-zero then keeps the
    server past hold end + grace (`idle-from-hold-end`)."""
    world = always_on
    started = prewarmed_start(world)
    world.driver("net-a").replicas = 1
    world.server("net-a").up = False  # booting slowly
    world.clock.advance(world.rt.settings.net("net-a").ready_timeout_s + 1)
    reconciler.reconcile(world.rt)  # (now an OUTAGE: `overdue_start`)
    world.server("net-a").up = True
    world.clock.advance(30)
    reconciler.reconcile(world.rt)
    net = world.net("net-a")
    assert net.state == NetState.READY
    assert net.idle_since == started + timedelta(seconds=12)


def test_a_prewarm_start_a_redeploy_made_always_on_before_its_replica_gets_one(always_on):
    """The same OUTAGE at zero replicas with no abort: a prewarm moved the scale-to-zero net
    STARTING and a redeploy made it always-on before its warm_up asked for the replica
    (warm_up skips an always-on net). Nothing asks for it: the watch leaves STARTING alone,
    then OUTAGE (`overdue_start`) for good; a job pinned to the net waits for ever."""
    world = always_on
    world.server("net-a").up = False  # no replica: nothing answers
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").transition(NetState.STARTING, world.clock(), "prewarm")
    _a_later_job_gets_net_a_up(world)

"""A break-it review of the Flower strays' change (strays on a net whose pending runs revive
are settled only by the server's word): what a SuperLink that never settles its stray does
to the net's server and queue, what held, and NVFLARE's twin of each shape (unchanged)."""

from __future__ import annotations

import itertools

from sqlalchemy import select

from app.errors import ServerUnavailable, UnknownAdminError
from app.settings import Settings
from app.usecases import (
    abort,
    declared_nets,
    dispatch,
    drains,
    intake,
    net_repairs,
    reconciler,
    records,
    scale_down,
)
from models import JobState, NetState, StrayRun
from tests.unit.conftest import World
from tests.unit.test_flower_dispatch_race import _race, flower_settings  # noqa: F401
from tests.unit.test_flower_fakes import NET
from tests.unit.test_revived_strays import _net_state as _state
from tests.unit.test_revived_strays import _strays, _world

ROUND_S = 30.0  # one reconcile (and idle scale-down) round every 30 s, as the beat runs them
LONG_ROUND_S = 60.0  # hours of rounds: every other one (the timings that matter are minutes)


def _rounds(world: World, count: int, every_s: float = ROUND_S) -> list[tuple[float, int]]:
    """Run `count` housekeeping rounds; (seconds since the first, replicas) after each."""
    seen = []
    for i in range(count):
        reconciler.reconcile(world.rt)
        scale_down.scale_down_idle_nets(world.rt)
        seen.append((i * every_s, world.driver(world.net_name).replicas))
        world.clock.advance(every_s)
    return seen


def _hours(world: World, hours: float) -> list[tuple[float, int]]:
    return _rounds(world, int(hours * 3600 / LONG_ROUND_S), LONG_ROUND_S)


def _never_settling(world: World, net: str) -> None:
    """The stray's run reads RUNNING and every stop of it fails (the server answers
    readiness, but will not let the run be stopped)."""
    world.server(net).statuses["7"] = "RUNNING"

    def refused(_: str):
        raise UnknownAdminError("stop refused")

    build = world.rt.admin_factory

    def refusing(net_config, settings):  # every client of the server (one per restart)
        admin = build(net_config, settings)
        admin.abort = refused  # type: ignore[method-assign]
        return admin

    world.rt.admin_factory = refusing  # type: ignore[misc]
    world.admin(net).abort = refused  # type: ignore[method-assign]


def _starts(seen: list[tuple[float, int]]) -> list[float]:
    """When the server was started (replicas rose from one round to the next)."""
    return [at for (_, before), (at, now) in itertools.pairwise(seen) if now > before]


def test_a_flower_net_whose_superlink_never_answers_is_started_ever_less_often(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """A stray's SuperLink that never answers (kit broken, wrong address): its net is
    started to settle the stray, given up at its readiness deadline, and once the stray is
    overdue rests at zero as long as the stray had waited (doubling), never over an hour
    (once seen: started again every round, 17 times an hour)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    world.server("fl-a").up = False  # the replica runs; its SuperLink never answers
    world.add_stray(world.enqueue("lost", net="fl-a"), "fl-a", "7", token="tok-0")
    starts = [0.0, *_starts(_hours(world, 3))]
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert len(starts) <= 7, f"started {len(starts)} times in 3 hours: {starts}"
    assert gaps == sorted(gaps), f"the rests shrank: {gaps}"
    ready_s = world.rt.settings.net("fl-a").ready_timeout_s
    assert max(gaps) <= net_repairs.SETTLE_REST_MAX_S + ready_s + 4 * LONG_ROUND_S, gaps
    assert len(_strays(world, "fl-a")) == 1 and world.driver("fl-a").replicas in (0, 1)


def unanswered_for(world: World, hours: float) -> World:
    """fl-a holds a stray (run 7, its job waiting for net-a) whose SuperLink has not
    answered for `hours` of housekeeping rounds."""
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    server = world.server("fl-a")
    server.up = False
    server.statuses["7"] = "RUNNING"
    world.add_stray(world.enqueue("lost", net="net-a"), "fl-a", "7", token="tok-0")
    _hours(world, hours)
    return world


def test_a_mended_superlink_settles_its_stray_within_the_hour(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """After three hours of a SuperLink that never answered, it answers again: the next
    start (within SETTLE_REST_MAX_S, not the four hours the stray had waited) settles it."""
    world = unanswered_for(_world(tmp_path, job_root, sqlite_factory, clock), hours=3)
    server = world.server("fl-a")
    server.up = True
    ready_s = world.rt.settings.net("fl-a").ready_timeout_s
    _hours(world, 1 + ready_s / 3600)  # the README's promise: within the hour
    _rounds(world, 4)
    assert _strays(world, "fl-a") == [] and server.aborted == ["7"]


def test_a_job_that_cannot_be_claimed_onto_it_keeps_no_flower_server_up(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """A QUEUED job that fits a Flower net while a stray the SuperLink will not stop keeps it
    off: the idle grace takes the server down (once seen: kept up for ever, since the idle
    check counted the job and the claim refused the net), and it rests at zero ever longer."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    world.server("fl-a")
    world.add_stray(world.enqueue("lost", net="fl-a"), "fl-a", "7", token="tok-0")
    _never_settling(world, "fl-a")
    waiting = world.enqueue("waiting", net="fl-a")
    seen = _hours(world, 3)
    assert world.job(waiting).state == JobState.QUEUED, "the stray keeps it off the net"
    assert len(_strays(world, "fl-a")) == 1
    up = sum(1 for _, replicas in seen if replicas) / len(seen)
    assert up < 0.1, f"the server was up {up:.0%} of three hours for a job it cannot take"


def test_nvflare_s_twin_takes_the_net_down_and_frees_the_job(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Held: the same shape on an NVFLARE net expires the stray past ABORT_TIMEOUT_S (net
    taken down, stray gone with its server), and the waiting job is claimed."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "net-a"  # type: ignore[attr-defined]
    world.server("net-a")
    world.driver("net-a").replicas = 1
    world.add_stray(world.enqueue("lost", net="net-a"), "net-a", "7", token="tok-0")
    _never_settling(world, "net-a")
    waiting = world.enqueue("waiting", net="net-a")
    _rounds(world, 20)  # 10 min: past ABORT_TIMEOUT_S (300 s)
    assert _strays(world, "net-a") == []
    # The older job (its stray gone with the server) is claimed first: no job is stuck.
    claimed = [(a.job_id, a.net_name) for a in dispatch.claim_and_start(world.rt)]
    assert claimed and claimed[0][1] == "net-a"
    assert world.job(waiting).state == JobState.QUEUED  # next in line, not held by a stray


def test_a_net_started_for_its_strays_settles_them_and_goes_back_to_zero(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Held: a STOPPED Flower net with a stray is started job-less, the SuperLink's stop
    settles the stray, and the idle net is scaled down after its grace (not left up)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    world.server("fl-a").statuses["7"] = "RUNNING"
    # Its job waits for another net (a job that fits fl-a would rightly keep it up).
    world.add_stray(world.enqueue("lost", net="net-a"), "fl-a", "7", token="tok-0")
    seen = _rounds(world, 10)
    assert _strays(world, "fl-a") == []
    assert world.server("fl-a").aborted == ["7"]
    assert max(replicas for _, replicas in seen) == 1
    assert seen[-1][1] == 0 and _state(world, "fl-a") == NetState.STOPPED


def test_one_stray_whose_lookup_fails_leaves_the_other_settled(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Held: two strays on one Flower net; the token lookup of one fails (a later run of its
    token could not be stopped): the other is settled all the same, the first kept."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    server = world.server("fl-a")
    world.driver("fl-a").replicas = 1
    server.statuses |= {"7": "RUNNING", "8": "RUNNING"}
    world.add_stray(world.enqueue("a", net="fl-a"), "fl-a", "7", token="tok-a")
    world.add_stray(world.enqueue("b", net="fl-a"), "fl-a", "8", token="tok-b")
    admin = world.admin("fl-a")
    real = admin.find_run

    def find_run(token: str) -> str | None:
        if token == "tok-a":
            raise ServerUnavailable("later run of tok-a not stopped yet")
        return real(token)

    admin.find_run = find_run  # type: ignore[method-assign]
    assert abort.settle_stray_runs(world.rt, "fl-a") == 1
    (left,) = _strays(world, "fl-a")
    assert left.nvflare_job_id == "7" and server.aborted == ["8"]


def test_a_job_waiting_for_a_net_started_for_its_strays_is_claimed_once_they_settle(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Held: the net started job-less for its stray (STARTING) is claimed by the job that
    waits for it once the stray is settled, and its chain runs there (its scale-up finds
    the replica already asked for)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.server("fl-a").statuses["7"] = "RUNNING"
    world.add_stray(world.enqueue("lost", net="net-a"), "fl-a", "7", token="tok-0")
    waiting = world.enqueue("waiting", net="fl-a")
    assert [a.job_id for a in dispatch.claim_and_start(world.rt)] != [waiting]
    reconciler.reconcile(world.rt)  # started, and its SuperLink's stop settles the stray
    assert _strays(world, "fl-a") == []
    net, _attempt = world.run_until_ready(waiting)
    assert net == "fl-a" and world.driver("fl-a").calls == [1, 1]
    assert world.job(waiting).state == JobState.ASSIGNED


def test_an_unconfirmed_abort_s_flower_stray_stops_the_later_run_of_its_token(
    flower_settings: Settings,  # noqa: F811
    sqlite_factory,
    clock,
) -> None:
    race = _race(flower_settings, sqlite_factory, clock, refused_after=1)
    assert len(race.live_of_token()) == 2, "the later run lives until a lookup stops it"
    assert intake.request_abort(race.b, race.job_id, "user").decision.needs_server_abort
    race.b.admin(NET).api.refusing = 1  # type: ignore[attr-defined]  # the stop is refused
    assert abort.abort_on_server(race.b, race.job_id) == JobState.ABORTED
    with sqlite_factory() as session:
        (stray,) = session.scalars(select(StrayRun)).all()
        assert stray.nvflare_job_id == race.kept
    assert abort.settle_stray_runs(race.b, NET) == 0
    assert race.live_of_token() == set(), "a run of the aborted attempt lives on"


def test_a_drained_flower_net_holding_a_stray_is_started_to_settle_it_then_left_at_zero(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Held: a drain keeps jobs off the net, not its SuperLink from stopping a run pending in
    its database: the net is started job-less, the stray settled, the server back at zero
    after its grace, and the job pinned to it still waits (drained)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    world.server("fl-a").statuses["7"] = "RUNNING"
    world.add_stray(world.enqueue("lost", net="net-a"), "fl-a", "7", token="tok-0")
    waiting = world.enqueue("waiting", net="fl-a")
    drains.drain(world.rt, ["fl-a"])
    seen = _rounds(world, 10)
    assert _strays(world, "fl-a") == [] and world.server("fl-a").aborted == ["7"]
    assert seen[-1][1] == 0 and _state(world, "fl-a") == NetState.STOPPED
    assert waiting not in [a.job_id for a in dispatch.claim_and_start(world.rt)]
    assert world.job(waiting).state == JobState.QUEUED


def test_a_stray_that_aged_while_its_net_was_misconfigured_is_settled_at_the_next_round(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Sweep seed 259 (misconfig): a Flower net's job is lost as its admin kit breaks (the net
    MISCONFIGURED, its run kept as a stray); five minutes later a worker restart makes the net
    STOPPED. No SuperLink was ever asked to settle the stray, so the net is started to settle
    it at once (seen: it rested 305 s at zero, the stray's age, as if a start had failed, and
    a job pinned to the net waited that long)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    world.server("fl-a").statuses["7"] = "RUNNING"
    world.add_stray(world.enqueue("lost", net="fl-a"), "fl-a", "7", token="tok-0")
    with world.rt.sessions.begin() as session:
        net = records.get_net(session, "fl-a")
        net.state, net.state_changed_at = NetState.MISCONFIGURED, clock()
    clock.advance(300.0)  # a human restarts the workers: MISCONFIGURED -> STOPPED, now
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, clock(), at_start=True)
    assert _state(world, "fl-a") == NetState.STOPPED
    _rounds(world, 2)
    assert world.driver("fl-a").replicas == 1, "rested at zero: no start had failed to settle it"

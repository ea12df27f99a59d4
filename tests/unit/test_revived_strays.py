"""Stray runs on a net whose pending runs revive (a Flower SuperLink with its state
database: `NetConfig.pending_runs_revive`) are not gone with its server: a run pending
when the server went away starts with the next one, so its stray is kept until a server
that answers settles it (simulation seeds 870, 947, 1387 on scale-to-zero nets, 499 on an
always-on one). NVFLARE nets keep their rule: a dead server's runs are gone with it."""

from __future__ import annotations

from sqlalchemy import select

from app.errors import UnknownAdminError
from app.usecases import abort, dispatch, reconciler, records, revived_runs, scaling
from models import JobState, NetState, StrayRun
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of


def _flower(tmp_path, name: str) -> dict[str, object]:
    decl = net_decl(tmp_path, name, "ecs", idle_timeout_s=60, ready_timeout_s=120)
    del decl["admin"]
    return decl | {"backend": "flower", "flower": {"address": f"{name}:9093", "insecure": True}}


def _world(tmp_path, job_root, sqlite_factory, clock, **extra) -> World:
    nets = [_flower(tmp_path, "fl-a"), net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60)]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, **extra)


def _strays(world: World, net: str) -> list[StrayRun]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun).where(StrayRun.net_name == net)))


def _net_state(world: World, net: str) -> NetState:
    with world.rt.sessions() as session:
        return records.get_net(session, net).state


def _stray_on(world: World, net: str) -> None:
    world.server(net)  # its fake server and driver
    world.driver(net).replicas = 1
    world.add_stray(world.enqueue(f"j-{net}", net=net), net, "7", token="tok-0")


def test_taking_a_flower_net_down_keeps_its_strays_and_an_nvflare_net_s_go_with_it(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    for net in ("fl-a", "net-a"):
        _stray_on(world, net)
        assert scaling.take_down(world.rt, net, "test")
        assert world.driver(net).replicas == 0
    assert len(_strays(world, "fl-a")) == 1, "a run pending in its database would revive"
    assert _strays(world, "net-a") == []


def test_reconcile_starts_a_stopped_flower_net_to_settle_its_strays(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Only a server that answers can stop a run its database keeps, and the stray keeps
    jobs off the net (and its own job anywhere) until then: the net is started, job-less."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    _stray_on(world, "fl-a")
    world.server("fl-a").up = False
    assert scaling.take_down(world.rt, "fl-a", "test")
    assert _net_state(world, "fl-a") == NetState.STOPPED
    reconciler.reconcile(world.rt)
    assert world.driver("fl-a").replicas == 1
    assert _net_state(world, "fl-a") == NetState.STARTING
    assert len(_strays(world, "fl-a")) == 1


def test_an_unsettled_stray_never_takes_a_flower_net_down(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Taking it down would settle nothing (the stray outlives it) and reconcile would
    start it again: the stray waits for the server's answer, logged for an operator."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    _stray_on(world, "fl-a")
    clock.advance(world.rt.settings.abort_timeout_s + 1)
    assert not abort.expire_stray_runs(world.rt, "fl-a")
    assert world.driver("fl-a").replicas == 1


def test_an_always_on_flower_net_with_no_server_keeps_its_strays(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Its server crashed (or was scaled to 0 by hand): the platform or an operator brings it
    back, and the run pending in its database with it (seed 499)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock, PER_JOB_FL_SERVER="false")
    for net in ("fl-a", "net-a"):
        world.server(net)
    reconciler.reconcile(world.rt)  # both servers up: READY
    for net in ("fl-a", "net-a"):
        assert _net_state(world, net) == NetState.READY
        _stray_on(world, net)
        world.server(net).up = False
        world.driver(net).replicas = 0
    reconciler.reconcile(world.rt)
    assert len(_strays(world, "fl-a")) == 1, "a run pending in its database would revive"
    assert _strays(world, "net-a") == []


def test_a_flower_stop_settles_a_stray_whose_status_the_superlink_cannot_give(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """A stop is final in Flower (finished:stopped at once, never started after): its answer
    settles the stray. Waiting for a status read as on NVFLARE would keep it for ever, since
    no take-down settles a Flower net's strays (sweep seed 67: a run with no status). An
    NVFLARE net keeps its rule: only a status read, now, says the run is over."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    for net in ("fl-a", "net-a"):
        _stray_on(world, net)
        world.server(net).statuses["7"] = "RUNNING"

        def unreadable(_: str):
            raise UnknownAdminError("run has no status")

        world.admin(net).job_status = unreadable  # type: ignore[method-assign]
    assert abort.settle_stray_runs(world.rt, "fl-a") == 0
    assert abort.settle_stray_runs(world.rt, "net-a") == 1


def test_the_monitor_stops_a_run_beside_a_running_job_but_none_while_a_submit_is_in_flight(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """`stop_uncounted_runs`: a run the net's RUNNING job does not count is stopped, the
    job's own kept; while the net's job is still submitting (ASSIGNED, DISPATCHING) a live
    run may be its own, not yet recorded: nothing is stopped."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    server = world.server("fl-a")
    job = world.enqueue("a", net="fl-a")
    world.run_until_ready(job)
    server.statuses["nv-9"] = "RUNNING"  # its submit's run, on the wire
    assert revived_runs.stop_uncounted_runs(world.rt, "fl-a") == []
    del server.statuses["nv-9"]
    dispatch.dispatch(world.rt, job, "fl-a", world.job(job).attempts)
    own = world.job(job).nvflare_job_id
    server.statuses["nv-9"] = "RUNNING"
    assert revived_runs.stop_uncounted_runs(world.rt, "fl-a", [own]) == ["nv-9"]
    assert server.aborted == ["nv-9"] and world.job(job).state == JobState.RUNNING
    assert revived_runs.stop_uncounted_runs(world.rt, "fl-a", [own]) == []

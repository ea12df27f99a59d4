"""Break-it review of round 10's Flower strays (the settling rest, the monitor's stop of the
runs a job does not count) and its two fixes: a restart after fixing settings a settling
start found wrong rested the net up to an hour; a clock stepped back behind a stray's
recording made the net start to settle it every few rounds again; a token's later run left
by a blip in the round that ended its job un-held lived on an idle always-on net; a
MISCONFIGURED net at zero replicas was asked for its stray every round. Each was a strict
xfail on 623b430's code, and passes since."""

from __future__ import annotations

import pytest

from app.errors import AdminMisconfigured, MisconfigurationError, ServerUnavailable
from app.usecases import declared_nets, monitor, reconciler, scale_down, scaling
from models import JobState, NetState
from tests.unit.conftest import World
from tests.unit.test_flower_stray_rest import count_find_runs
from tests.unit.test_flower_stray_settling import _hours, _rounds, _starts, unanswered_for
from tests.unit.test_revived_strays import _net_state as _state
from tests.unit.test_revived_strays import _strays, _world


def _broken(world: World, cause: str) -> list[bool]:
    """fl-a's settings are wrong until the flag it returns is cleared: its admin kit (its CA
    does not match the SuperLink's certificate, read as the client is built) or its
    service (the platform has none by that name, found as the net is scaled up)."""
    broken = [True]
    if cause == "kit":
        build = world.rt.admin_factory

        def kit(net_config, settings):
            if broken[0] and net_config.name == "fl-a":
                raise AdminMisconfigured("fl-a: CA does not match the SuperLink's certificate")
            return build(net_config, settings)

        world.rt.admin_factory = kit  # type: ignore[misc]
    else:
        driver = world.driver("fl-a")
        scale = driver.scale

        def service(replicas: int) -> None:
            if broken[0] and replicas:
                raise MisconfigurationError("ECS service fl-a not found")
            scale(replicas)

        driver.scale = service  # type: ignore[method-assign]
    return broken


@pytest.mark.parametrize("cause", ["kit", "service"])
def test_a_restart_after_fixing_what_a_settling_start_found_wrong_settles_at_once(
    tmp_path, job_root, sqlite_factory, clock, cause: str
) -> None:
    """fl-a holds a stray (its SuperLink healthy: its stop would settle it). The settling
    start finds the net's settings wrong: the net is MISCONFIGURED (at zero replicas). Two
    hours later the operator fixes them and restarts the workers, "the human saying try
    again" (sync_nets); the net rests an hour first, as if its SuperLink had failed to
    settle the stray (the review of the rest: "a net misconfigured meanwhile starts at
    once")."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    server = world.server("fl-a")
    server.statuses["7"] = "RUNNING"
    world.add_stray(world.enqueue("lost", net="net-a"), "fl-a", "7", token="tok-0")
    broken = _broken(world, cause)
    _rounds(world, 2)
    assert _state(world, "fl-a") == NetState.MISCONFIGURED
    clock.advance(2 * 3600)
    broken[0] = False  # fixed, and the workers restarted
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, clock(), at_start=True)
    assert _state(world, "fl-a") == NetState.STOPPED
    _rounds(world, 10)  # five minutes
    assert _strays(world, "fl-a") == [] and server.aborted == ["7"]


def test_a_clock_stepped_back_behind_the_stray_does_not_start_the_net_every_few_rounds(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """fl-a's SuperLink has not answered for two hours (the net rests at zero between
    settling starts); then the dispatcher's clock is stepped back five hours (a VM resumed
    from an old snapshot, an NTP step), behind the stray's recording. One start without a
    rest is the rule's own answer to a stop it cannot date; a start every four minutes is
    the storm the rest was made to end."""
    world = unanswered_for(_world(tmp_path, job_root, sqlite_factory, clock), hours=2)
    assert _state(world, "fl-a") == NetState.STOPPED
    clock.advance(-5 * 3600)
    starts = _starts(_hours(world, 2))
    assert len(starts) <= 4, f"started {len(starts)} times in two hours: {starts}"


def test_a_later_run_left_by_a_blip_in_an_unheld_verdict_round_is_stopped_on_an_idle_net(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """The FINISHING hold's twin (test_monitor_stops_uncounted_runs): the run's verdict
    COMPLETES the job and frees the net in the very round whose list of live runs fails
    once; from then on the SuperLink answers every round, but the net has no job, so no
    round lists its runs again. On an always-on net the job's training runs a second time
    until the next job's readiness, however long the net idles."""
    world = _world(tmp_path, job_root, sqlite_factory, clock, PER_JOB_FL_SERVER="false")
    server = world.server("fl-a")
    world.server("net-a")
    reconciler.reconcile(world.rt)  # both always-on servers up: READY
    job = world.enqueue("a", net="fl-a")
    world.run_pipeline(job)
    run = world.job(job).nvflare_job_id
    server.statuses["nv-9"] = "RUNNING"  # a later run of the token, its step's retries spent
    server.statuses[run] = "FINISHED:COMPLETED"
    admin = world.admin("fl-a")
    listed = admin.live_runs

    def blip() -> frozenset[str]:
        raise ServerUnavailable("refused, this once")

    admin.live_runs = blip  # type: ignore[method-assign]
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job).state == JobState.COMPLETED
    admin.live_runs = listed  # type: ignore[method-assign]
    for _ in range(20):  # ten minutes; the SuperLink answers every round
        clock.advance(30)
        monitor.monitor_running_jobs(world.rt)
        reconciler.reconcile(world.rt)
        scale_down.scale_down_idle_nets(world.rt)
    assert _state(world, "fl-a") == NetState.READY
    assert "nv-9" not in admin.live_runs(), "a run no job counts lives on the idle net"


def test_a_misconfigured_flower_net_at_zero_replicas_is_not_called_every_round(
    tmp_path, job_root, sqlite_factory, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sweep seed 259's shape: the net's job was lost as its admin kit broke (the net
    MISCONFIGURED, its run kept as a stray) and its server is at zero replicas. Nothing
    can settle the stray until a human fixes the net, yet every round asks a SuperLink that
    does not run (test_flower_stray_rest: a resting net's absent SuperLink is not called)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    world.server("fl-a").statuses["7"] = "RUNNING"
    world.add_stray(world.enqueue("lost", net="net-a"), "fl-a", "7", token="tok-0")
    assert scaling.net_misconfigured(world.rt, "fl-a", None, "admin kit unreadable")
    calls = count_find_runs(monkeypatch)
    seen = _rounds(world, 10)  # five minutes
    assert _state(world, "fl-a") == NetState.MISCONFIGURED
    assert max(replicas for _, replicas in seen) == 0
    assert calls == [], f"{len(calls)} calls to a SuperLink at zero replicas"

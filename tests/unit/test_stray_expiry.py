"""A stray run the server cannot settle within ABORT_TIMEOUT_S (to the second): a
scale-to-zero net is taken down while idle, saying why; an always-on net keeps its strays
for an operator (nothing here can restart its server)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.errors import UnknownAdminError
from app.usecases import abort, dispatch, reconciler
from models import JobState, StrayRun
from tests.unit.scale_history import scale_decisions


def _unsettleable_stray(world, net: str) -> None:
    job_id = world.enqueue(f"j-{net}", net=net)
    world.add_stray(job_id, net, "nv-7")
    world.server(net).statuses["nv-7"] = "RUNNING"

    def unreadable(_: str):
        raise UnknownAdminError("job has no status")

    world.admin(net).job_status = unreadable  # type: ignore[method-assign]


def _strays(world):
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def test_a_scale_to_zero_net_is_taken_down_at_exactly_the_abort_timeout(world):
    world.driver("net-a").replicas = 1
    _unsettleable_stray(world, "net-a")
    world.clock.advance(world.rt.settings.abort_timeout_s - 1)
    assert not abort.expire_stray_runs(world.rt, "net-a")
    assert world.driver("net-a").replicas == 1
    world.clock.advance(1)
    assert abort.expire_stray_runs(world.rt, "net-a")
    assert world.driver("net-a").replicas == 0
    timeout = f"{world.rt.settings.abort_timeout_s:.0f}s"
    assert scale_decisions(world, "net-a")[-1] == (
        0,
        f"stray run(s) unsettled for over {timeout}",
    )
    assert _strays(world) == []  # gone with the server


def test_an_always_on_net_keeps_its_strays_for_an_operator(world):
    _unsettleable_stray(world, "fixed")
    world.clock.advance(world.rt.settings.abort_timeout_s + 1)
    assert not abort.expire_stray_runs(world.rt, "fixed")
    assert len(_strays(world)) == 1
    assert scale_decisions(world, "fixed") == []


def test_a_net_without_strays_is_left_alone(world):
    world.driver("net-a").replicas = 1
    world.clock.advance(world.rt.settings.abort_timeout_s + 1)
    assert not abort.expire_stray_runs(world.rt, "net-a")
    assert world.driver("net-a").replicas == 1


def test_a_stray_held_for_its_start_window_is_overdue_no_sooner_than_that_window(world):
    """With ABORT_TIMEOUT_S under RUN_START_WINDOW_S, a run aborted before it started is not
    taken for one that will not settle while its window runs (it settles by itself)."""
    world.rt.settings = world.rt.settings.model_copy(update={"abort_timeout_s": 10.0})
    world.driver("net-a").replicas = 1
    _unsettleable_stray(world, "net-a")
    with world.rt.sessions.begin() as session:
        [stray] = session.scalars(select(StrayRun)).all()
        stray.settle_after = world.clock() + timedelta(seconds=abort.RUN_START_WINDOW_S)
    world.clock.advance(abort.RUN_START_WINDOW_S - 1)
    assert not abort.expire_stray_runs(world.rt, "net-a")
    assert world.driver("net-a").replicas == 1
    world.clock.advance(1)
    assert abort.expire_stray_runs(world.rt, "net-a")


def test_a_window_pushed_on_and_on_still_expires_at_the_abort_timeout(world):
    """Counted from when the stray was recorded, not from its (pushed) window's end."""
    world.driver("net-a").replicas = 1
    _unsettleable_stray(world, "net-a")
    world.clock.advance(world.rt.settings.abort_timeout_s)
    with world.rt.sessions.begin() as session:
        [stray] = session.scalars(select(StrayRun)).all()
        stray.settle_after = world.clock() + timedelta(seconds=abort.RUN_START_WINDOW_S)
    assert abort.expire_stray_runs(world.rt, "net-a")


def test_a_stray_not_held_expires_at_an_abort_timeout_shorter_than_the_start_window(world):
    world.rt.settings = world.rt.settings.model_copy(update={"abort_timeout_s": 10.0})
    world.driver("net-a").replicas = 1
    _unsettleable_stray(world, "net-a")
    world.clock.advance(9)
    assert not abort.expire_stray_runs(world.rt, "net-a")
    world.clock.advance(1)
    assert abort.expire_stray_runs(world.rt, "net-a")


def test_a_stray_the_server_cannot_settle_takes_an_idle_scale_to_zero_net_down(world):
    # simulator seeds 139/143: a stray whose status the server cannot give stayed unsettled
    # for ever, and the job waiting for the net with it starved.
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False  # a blip while the abort goes out: kept as a stray
    assert world.abort(job_id) == JobState.ABORTED
    world.server("net-a").up = True

    def unreadable(_: str):
        raise UnknownAdminError("job has no status")

    world.admin("net-a").job_status = unreadable  # type: ignore[method-assign]
    waiting = world.enqueue("next", net="net-a")
    reconciler.reconcile(world.rt)
    assert len(_strays(world)) == 1 and world.driver("net-a").replicas == 1  # not yet
    world.clock.advance(world.rt.settings.abort_timeout_s + 1)
    reconciler.reconcile(world.rt)
    assert _strays(world) == [] and world.driver("net-a").replicas == 0
    assert [a.job_id for a in dispatch.claim_and_start(world.rt)] == [waiting]

"""The rest a Flower net takes at zero between the starts that settle an overdue stray
(`net_repairs._settle_rest_s`), as a break-it review tried it: no rest unless a settling
start failed, an operator's restart adopted (not taken down as drift), nothing called or
logged each round of the rest, a clock stepped back. Each test failed on the rest's first
version (the review's strict xfails)."""

from __future__ import annotations

import logging

import pytest

from app.usecases import declared_nets, reconciler, scaling
from models import NetState
from tests.fakes import FakeAdmin
from tests.unit.conftest import World
from tests.unit.test_flower_stray_settling import _hours, _rounds, _starts, unanswered_for
from tests.unit.test_revived_strays import _net_state as _state
from tests.unit.test_revived_strays import _strays, _world

OPERATOR_LINE = "stray runs need an operator"


def count_find_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each token a fake admin is asked to find from now on (a server asked about a stray)."""
    calls: list[str] = []
    real = FakeAdmin.find_run

    def counted(admin: FakeAdmin, token: str) -> str | None:
        calls.append(token)
        return real(admin, token)

    monkeypatch.setattr(FakeAdmin, "find_run", counted)
    return calls


def _resting(tmp_path, job_root, sqlite_factory, clock) -> World:
    """fl-a holds a stray its SuperLink never answered for two hours: the net rests at
    zero (its next settling start is nine minutes away). The stray's job waits for net-a."""
    world = unanswered_for(_world(tmp_path, job_root, sqlite_factory, clock), hours=2)
    assert _state(world, "fl-a") == NetState.STOPPED and world.driver("fl-a").replicas == 0
    return world


def test_a_superlink_restarted_by_hand_while_its_net_rests_settles_the_stray(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """The alert's advice ("restart the server; the strays clear once the server says the
    run is over"): the operator mends the SuperLink and scales its service to one replica.
    The net is STOPPED, so reconcile's drift repair scales it to zero first, and the settling
    that follows in the same round finds no server: the stray waits for the next settling
    start, up to an hour away, and its job with it."""
    world = _resting(tmp_path, job_root, sqlite_factory, clock)
    server = world.server("fl-a")
    server.up = True  # mended
    world.driver("fl-a").replicas = 1  # and started by hand
    _rounds(world, 4)
    assert _strays(world, "fl-a") == [], "the stray outlived a SuperLink that would stop it"
    assert server.aborted == ["7"]


def test_a_restart_after_a_fixed_misconfiguration_settles_the_stray_without_a_rest(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """The net was MISCONFIGURED (its kit unreadable: no SuperLink was ever asked) while its
    stray aged two hours; the operator fixes it and restarts ("a restart after a fix is the
    human saying try again"). Nothing failed to settle the stray, yet the net rests as long
    as the stray's age (capped at an hour) before it is started, and jobs pinned to the net,
    and the stray's own job, wait that long."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    server = world.server("fl-a")
    server.statuses["7"] = "RUNNING"  # a healthy SuperLink: its stop settles the stray
    world.add_stray(world.enqueue("lost", net="net-a"), "fl-a", "7", token="tok-0")
    assert scaling.net_misconfigured(world.rt, "fl-a", None, "admin kit unreadable")
    clock.advance(2 * 3600)  # (no reconcile could reach it meanwhile)
    with world.rt.sessions.begin() as session:  # the restart after the fix
        declared_nets.sync_nets(session, world.rt.settings, clock(), at_start=True)
    assert _state(world, "fl-a") == NetState.STOPPED
    _rounds(world, 10)  # five minutes
    assert _strays(world, "fl-a") == [] and server.aborted == ["7"]


def test_a_resting_net_does_not_log_for_an_operator_every_round(
    tmp_path, job_root, sqlite_factory, clock, caplog: pytest.LogCaptureFixture
) -> None:
    """The rest is there so a broken SuperLink is not started every round; the error line an
    operator reads still comes every round (about 60 an hour at one round a minute, 120 at
    the beat's 30 s) although only the settling starts try anything."""
    world = _resting(tmp_path, job_root, sqlite_factory, clock)
    caplog.set_level(logging.ERROR)
    caplog.clear()  # the two hours before
    starts = _starts(_hours(world, 1))
    lines = [r for r in caplog.records if r.getMessage().startswith(OPERATOR_LINE)]
    assert len(lines) <= 3 * (len(starts) + 1), f"{len(lines)} lines for {len(starts)} starts"


def test_a_resting_net_s_absent_superlink_is_not_called_every_round(
    tmp_path, job_root, sqlite_factory, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A net at zero replicas has no SuperLink to answer: reconcile (one net after another)
    still asks it for the stray's token every round of the rest, and a real client waits
    out its ADMIN_COMMAND_TIMEOUT_S (10 s) for each, so a few resting nets stretch every
    round (the keep-alive loop's rule: a stopped server is never contacted)."""
    world = _resting(tmp_path, job_root, sqlite_factory, clock)
    calls = count_find_runs(monkeypatch)
    seen = _rounds(world, 10)  # five minutes of the rest
    assert max(replicas for _, replicas in seen) == 0, "(still resting)"
    assert calls == [], f"{len(calls)} calls to a SuperLink at zero replicas"


def test_a_clock_stepped_back_does_not_lengthen_the_rest(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """The rest is measured from the net's stop time: a clock stepped back two hours (a VM
    resumed, an NTP step) adds two hours to it, past SETTLE_REST_MAX_S."""
    world = _resting(tmp_path, job_root, sqlite_factory, clock)
    server = world.server("fl-a")
    server.up = True  # mended
    clock.advance(-2 * 3600)
    ready_s = world.rt.settings.net("fl-a").ready_timeout_s
    _hours(world, 1 + ready_s / 3600)
    _rounds(world, 4)
    assert _strays(world, "fl-a") == [] and server.aborted == ["7"]


def test_a_resting_net_s_rest_survives_a_drain_an_undrain_and_a_restart(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """Held: nothing but a stop moves a resting net's state_changed_at (drain, undrain and a
    process restart's sync_nets leave it), so the rest is neither reset nor lengthened."""
    from app.usecases import drains

    world = _resting(tmp_path, job_root, sqlite_factory, clock)
    before = world.net("fl-a").state_changed_at
    drains.drain(world.rt, ["fl-a"])
    drains.undrain(world.rt, ["fl-a"])
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, clock(), at_start=True)
    reconciler.reconcile(world.rt)
    assert world.net("fl-a").state_changed_at == before
    assert world.driver("fl-a").replicas == 0

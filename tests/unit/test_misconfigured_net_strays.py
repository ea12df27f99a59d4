"""A net held MISCONFIGURED with a stray run is asked nothing about it: its settings are
wrong. A scale-to-zero NVFLARE net's stray at zero replicas died with its server (NVFLARE
keeps no run across a restart) and is forgotten, as for a STOPPED net at zero replicas; the
others wait for the human's fix (the Flower twin rests:
test_flower_stray_rest_clock_and_idle_runs.py). Found by the sweep's
`misconfigured-net-called` checked on every backend (misconfig 16, ops 50 and 248)."""

from __future__ import annotations

import pytest

from app.usecases import reconciler, scaling
from models import JobState, NetState
from tests.fakes import FakeAdmin
from tests.unit.test_revived_strays import _strays

pytestmark = pytest.mark.unit


def _count_admin_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the admin calls made from now on, in order."""
    calls: list[str] = []
    for name in ("job_status", "abort", "find_run", "live_runs", "server_start_time"):
        real = getattr(FakeAdmin, name)

        def counted(admin, *args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(admin, *args, **kwargs)

        monkeypatch.setattr(FakeAdmin, name, counted)
    return calls


def test_a_misconfigured_nvflare_net_at_zero_replicas_forgets_its_stray_without_a_call(
    world, monkeypatch: pytest.MonkeyPatch
):
    lost = world.enqueue("lost", net="net-a")
    world.server("net-a").statuses["7"] = "RUNNING"
    world.add_stray(lost, "net-a", "7")
    assert scaling.net_misconfigured(world.rt, "net-a", None, "admin kit unreadable")
    assert world.driver("net-a").replicas == 0
    calls = _count_admin_calls(monkeypatch)
    for _ in range(3):
        world.clock.advance(30)
        reconciler.reconcile(world.rt)
    assert _strays(world, "net-a") == []
    assert calls == []
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.job(lost).state == JobState.QUEUED


def test_an_always_on_net_held_misconfigured_is_not_asked_about_its_stray(
    always_on, monkeypatch: pytest.MonkeyPatch
):
    """Its settings are wrong (what answers may be another server, sweep ops seed 248: a
    redeploy made the net always-on while MISCONFIGURED at zero replicas): its strays wait
    for the human's fix and the restart that follows, as its jobs do."""
    world = always_on
    lost = world.enqueue("lost", net="net-a")
    world.server("net-a").statuses["7"] = "RUNNING"
    world.add_stray(lost, "net-a", "7")
    assert scaling.net_misconfigured(world.rt, "net-a", None, "admin kit unreadable")
    calls = _count_admin_calls(monkeypatch)
    for _ in range(3):
        world.clock.advance(30)
        reconciler.reconcile(world.rt)
    assert calls == []
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert len(_strays(world, "net-a")) == 1  # kept: nothing said the run is over

"""An NVFLARE net held MISCONFIGURED at zero replicas with a stray run: the run died with its
server (NVFLARE keeps no run across a restart), so reconcile forgets the stray as for a
STOPPED net at zero replicas, and asks nothing of a server that does not run (the Flower
twin rests instead: test_flower_stray_rest_clock_and_idle_runs.py). Found by the sweep's
`misconfigured-net-called` checked on every backend (misconfig seeds 16 and 50)."""

from __future__ import annotations

import pytest

from app.usecases import reconciler, scaling
from models import JobState, NetState
from tests.fakes import FakeAdmin
from tests.unit.test_revived_strays import _strays

pytestmark = pytest.mark.unit


def test_a_misconfigured_nvflare_net_at_zero_replicas_forgets_its_stray_without_a_call(
    world, monkeypatch: pytest.MonkeyPatch
):
    lost = world.enqueue("lost", net="net-a")
    world.server("net-a").statuses["7"] = "RUNNING"
    world.add_stray(lost, "net-a", "7")
    assert scaling.net_misconfigured(world.rt, "net-a", None, "admin kit unreadable")
    assert world.driver("net-a").replicas == 0
    calls: list[str] = []
    for name in ("job_status", "abort", "find_run", "live_runs", "server_start_time"):
        real = getattr(FakeAdmin, name)

        def counted(admin, *args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(admin, *args, **kwargs)

        monkeypatch.setattr(FakeAdmin, name, counted)
    for _ in range(3):
        world.clock.advance(30)
        reconciler.reconcile(world.rt)
    assert _strays(world, "net-a") == []
    assert calls == []
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert world.job(lost).state == JobState.QUEUED

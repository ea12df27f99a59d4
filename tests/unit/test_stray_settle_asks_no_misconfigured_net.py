"""A settle of a net's stray runs asks nothing of a net the dispatcher holds MISCONFIGURED
(its settings are wrong: what answers may be another server; its strays wait for the
human's fix, or are forgotten at zero replicas by reconcile), whoever sends the settle: the
settle task a late submit's "landed after the job moved on" sends too, not only reconcile
(chaos 9773: a stalled dispatch resumed on a MISCONFIGURED net, its settle called
job_status there)."""

from __future__ import annotations

from app.usecases import abort, records
from models import NetState


def test_a_settle_sent_for_a_misconfigured_net_calls_nothing_and_keeps_its_strays(world):
    job_id = world.enqueue("j", net="net-a")
    world.add_stray(job_id, "net-a", "nv-7")
    with world.rt.sessions.begin() as session:
        net = records.get_net(session, "net-a")
        net.transition(NetState.MISCONFIGURED, world.rt.clock(), "admin kit rejected")
    calls: list[str] = []
    admin = world.admin("net-a")
    for name in ("job_status", "abort", "find_run"):

        def called(*_args, _name=name):
            calls.append(_name)
            raise AssertionError(f"{_name} called on a MISCONFIGURED net")

        setattr(admin, name, called)

    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    assert calls == []

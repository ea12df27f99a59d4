"""A reconcile round whose read of the fleet misses a declared net's row (deleted by hand
between `_fleet`'s sync and its read again) leaves that net alone, as it did: no failure is
logged for it nor recorded on its row, which another process made again meanwhile."""

from __future__ import annotations

import logging

from sqlalchemy import delete

from app.db import unit_of_work
from app.usecases import declared_nets, reconciler
from models import Net


def test_a_net_row_missing_from_the_rounds_read_is_no_failure(world, monkeypatch, caplog):
    with unit_of_work(world.rt.sessions) as session:
        session.execute(delete(Net).where(Net.name == "fixed"))  # not there: `_fleet` syncs
    reads = []
    real_read = reconciler.read_fleet

    def read_fleet(session):  # the read again after the sync: the row deleted by hand first
        reads.append(1)
        if len(reads) == 2:
            with unit_of_work(world.rt.sessions) as other:
                other.execute(delete(Net).where(Net.name == "fixed"))
        return real_read(session)

    real_settle = reconciler.settle_undeclared

    def settle_undeclared(rt, removal=None):  # meanwhile another process's sync makes it again
        with unit_of_work(world.rt.sessions) as other:
            declared_nets.sync_nets(other, world.rt.settings, world.clock())
        return real_settle(rt, removal)

    monkeypatch.setattr(reconciler, "read_fleet", read_fleet)
    monkeypatch.setattr(reconciler, "settle_undeclared", settle_undeclared)
    with caplog.at_level(logging.ERROR):
        reconciler.reconcile(world.rt)
    assert len(reads) == 2  # the staging ran: the row was missing from the read again
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    with world.rt.sessions() as session:
        net = session.get(Net, "fixed")
        assert net is not None
        assert net.last_error is None

"""The callback lease on PostgreSQL, where transactions run side by side (SQLite takes its
write lock at BEGIN, so the unit tier cannot interleave them): a deliverer lets the lease
go and commits before it looks for what is due, so an event committed after that look is
delivered by its own kick, which finds the lease free."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.settings import Settings
from app.usecases import callbacks
from app.usecases.callbacks import due as callback_due
from tests.fixtures.db import FrozenClock, net_decl
from tests.unit.conftest import World
from tests.unit.test_callbacks import SECRET, Receiver

pytestmark = pytest.mark.integration


@pytest.fixture
def world(tmp_path, job_root, pg_factory, clock: FrozenClock) -> World:
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "net-a", "static")]),
        CALLBACK_URL="http://flip-api.invalid/callbacks",
        CALLBACK_SECRET=SECRET,
    )
    return World(settings, pg_factory, clock)


def test_an_event_committed_right_after_the_holders_last_look_is_delivered_by_its_kick(
    world, monkeypatch
):
    receiver = Receiver()
    first = world.enqueue("first", net="net-a")
    looks = 0
    late: list[Any] = []
    kicked: list[callbacks.DeliveryReport] = []

    def look_then_a_commit_and_its_kick(session: Any, now: Any) -> callback_due.Look:
        nonlocal looks
        looks += 1
        seen = callback_due.look(session, now)
        if looks == 2:  # the holder's look after letting go: nothing new is due yet
            late.append(world.enqueue("late", net="net-a"))
            kicked.append(callbacks.deliver_callbacks(world.rt, sender=receiver))
        return seen

    monkeypatch.setattr(callbacks, "look", look_then_a_commit_and_its_kick)
    holder = callbacks.deliver_callbacks(world.rt, sender=receiver)
    assert holder.delivered == 1 and receiver.accepted(first) == ["QUEUED"]
    assert not kicked[0].busy
    assert receiver.accepted(late[0]) == ["QUEUED"]  # by the kick, not left to the sweep

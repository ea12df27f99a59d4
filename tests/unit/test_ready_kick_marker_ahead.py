"""Break-it of round 13 on the ready worker's kick (`kicks.kick_when_ready`): it promises to
send "whatever the marker says" (app/usecases/README.md), the pending kick having maybe died
with the worker this one replaces."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app import names
from app.usecases import reconciler
from models import JobState, PendingKick, utcnow
from tests.unit.test_ready_kick import _ready_worker_sends

pytestmark = pytest.mark.unit


def test_a_lost_kick_dated_after_the_ready_workers_now_does_not_hold_back_its_kick(
    world, sqlite_url, monkeypatch
) -> None:
    """As test_ready_kick's lost kick, but its sender's clock ran two seconds ahead of the
    restarted worker's (another host), or the clock stepped back since it was sent."""
    reconciler.reconcile(world.rt)
    job_id = world.enqueue("lost-kick", required_sites=["site-1"])
    with world.rt.sessions.begin() as session:
        session.add(
            PendingKick(task=names.ASSIGN_NEXT_JOB, sent_at=utcnow() + timedelta(seconds=2))
        )
    assert world.job(job_id).state == JobState.QUEUED
    assert _ready_worker_sends(world, sqlite_url, monkeypatch) == [names.ASSIGN_NEXT_JOB]

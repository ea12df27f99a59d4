"""The ready worker's kick (`app.celery_app.kick_when_ready`, 7ac5f6f): once a worker is
ready it asks for an assign round when a claimable job waits, so a job the start requeued,
or one whose kick was lost while no worker ran, is claimed at once rather than at beat's
next round, up to HOUSEKEEPING_INTERVAL_S away. The kick is coalesced like every other:
no send while a kick marker (`pending_kicks`) is fresh."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from app import names
from app.usecases import reconciler
from models import JobState, PendingKick, utcnow
from tests.unit.conftest import World

pytestmark = pytest.mark.unit

INTERVAL_S = 3600.0  # beat's round an hour away, as the e2e test has it


def _ready_worker_sends(world: World, sqlite_url: str, monkeypatch: Any) -> list[str]:
    """What a worker that has just become ready sends (its `worker_ready` receivers run)."""
    import celery
    from celery import signals

    from app import celery_app

    sent: list[str] = []
    monkeypatch.setattr(celery.Celery, "send_task", lambda _app, name, *_a, **_k: sent.append(name))
    settings = world.rt.settings.model_copy(
        update={"database_url": sqlite_url, "housekeeping_interval_s": INTERVAL_S}
    )
    monkeypatch.setattr(celery_app._Configured, "settings", settings)
    signals.worker_ready.send(sender=None)
    return sent


def test_a_kick_lost_with_the_last_worker_does_not_hold_back_the_ready_kick(
    world, sqlite_url, monkeypatch
) -> None:
    """A job is enqueued and its kick sent (the marker set); the only worker receives the
    kick and is killed (OOM, a lost node) before the round starts, the message gone with
    it. The worker is restarted a minute later: the job QUEUED, a net free, the marker of
    the lost kick a minute old. The ready worker must ask for the round the lost kick did."""
    reconciler.reconcile(world.rt)
    job_id = world.enqueue("lost-kick", required_sites=["site-1"])
    with world.rt.sessions.begin() as session:
        # What CoalescingOutbox.send left for the lost kick (kicks.mark_pending).
        session.add(
            PendingKick(task=names.ASSIGN_NEXT_JOB, sent_at=utcnow() - timedelta(minutes=1))
        )
    assert world.job(job_id).state == JobState.QUEUED
    sent = _ready_worker_sends(world, sqlite_url, monkeypatch)
    # On 7ac5f6f: nothing sent; the job waits up to an hour with a net free.
    assert sent == [names.ASSIGN_NEXT_JOB]

"""The guards of services' shared steps: a repeated submit, a release while a job still
holds the net, and the cheap check that every declared net has its row."""

from __future__ import annotations

import pytest

from app.usecases import services
from models import JobState, NetState
from models.states import IllegalTransition
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of


def test_a_repeated_submit_of_the_same_run_changes_nothing(world):
    """mark_dispatched for a job already RUNNING that run is a repeated delivery: a no-op."""
    job_id = world.enqueue("repeat", net="net-a")
    world.run_pipeline(job_id)
    before = world.job(job_id).dispatched_at
    world.clock.advance(5)
    with world.rt.sessions.begin() as session:
        services.mark_dispatched(session, job_id, "nv-1", None, world.clock())
    assert world.job(job_id).dispatched_at == before
    assert world.net("net-a").state == NetState.BUSY


def test_another_run_for_a_running_job_is_refused(world):
    """A RUNNING job told of a different run is not taken for a repeat: the move is illegal."""
    job_id = world.enqueue("other", net="net-a")
    world.run_pipeline(job_id)
    with pytest.raises(IllegalTransition), world.rt.sessions.begin() as session:
        services.mark_dispatched(session, job_id, "nv-other", None, world.clock())
    assert world.job(job_id).nvflare_job_id == "nv-1"


def test_a_net_is_not_released_while_a_job_still_holds_it(world):
    """release_net leaves a BUSY net BUSY (no idle grace) while its job is active."""
    job_id = world.enqueue("holder", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        services.release_net(session, "net-a", world.clock())
    assert world.job(job_id).state == JobState.RUNNING
    assert world.net("net-a").state == NetState.BUSY
    assert world.net("net-a").idle_since is None


def test_rows_all_present_spare_the_locked_sync_even_beside_a_removed_nets_row(
    world, tmp_path, job_root, sqlite_factory, clock, monkeypatch
):
    """ensure_net_rows counts only the declared nets' rows: a removed net's row left in the
    table does not send every enqueue through sync_nets."""
    only_a = world_of(
        [net_decl(tmp_path, "net-a", "ecs")], tmp_path, job_root, sqlite_factory, clock
    )
    synced = []
    monkeypatch.setattr(services, "sync_nets", lambda *a: synced.append(a))
    with world.rt.sessions.begin() as session:
        services.ensure_net_rows(session, only_a.rt.settings, clock())
    assert synced == []

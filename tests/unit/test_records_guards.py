"""The guards of services' shared steps: a repeated submit, a release while a job still
holds the net, the cheap check that every declared net has its row, and a stray run
recorded once per run (one job's run on one net), never folded into another."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.usecases import declared_nets, records
from models import JobState, NetState, ReasonCode, StrayRun
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
        records.mark_dispatched(session, job_id, "nv-1", None, world.clock())
    assert world.job(job_id).dispatched_at == before
    assert world.net("net-a").state == NetState.BUSY


def test_another_run_for_a_running_job_is_refused(world):
    """A RUNNING job told of a different run is not taken for a repeat: the move is illegal."""
    job_id = world.enqueue("other", net="net-a")
    world.run_pipeline(job_id)
    with pytest.raises(IllegalTransition), world.rt.sessions.begin() as session:
        records.mark_dispatched(session, job_id, "nv-other", None, world.clock())
    assert world.job(job_id).nvflare_job_id == "nv-1"


def test_a_net_is_not_released_while_a_job_still_holds_it(world):
    """release_net leaves a BUSY net BUSY (no idle grace) while its job is active."""
    job_id = world.enqueue("holder", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        records.release_net(session, "net-a", world.clock())
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
    monkeypatch.setattr(declared_nets, "sync_nets", lambda *a: synced.append(a))
    with world.rt.sessions.begin() as session:
        declared_nets.ensure_net_rows(session, only_a.rt.settings, clock())
    assert synced == []


def _strays(world) -> list[tuple[str, object, str | None, str | None]]:
    with world.rt.sessions() as session:
        return [
            (s.net_name, s.job_id, s.nvflare_job_id, s.submit_token)
            for s in session.scalars(select(StrayRun).order_by(StrayRun.id))
        ]


def test_two_runs_of_one_job_on_one_net_are_two_strays(world):
    """Each live run is counted: a second run of the job on the same net (another run id)
    is not taken for the first one recorded again."""
    job_id = world.enqueue("j", net="net-a")
    world.add_stray(job_id, "net-a", "nv-1")
    world.add_stray(job_id, "net-a", "nv-2")
    assert _strays(world) == [
        ("net-a", job_id, "nv-1", None),
        ("net-a", job_id, "nv-2", None),
    ]


def test_two_runs_known_only_by_their_tokens_are_two_strays(world):
    """Two submits whose outcome is unknown (no run id yet), with two tokens: two runs
    the server may hold, so two strays."""
    job_id = world.enqueue("j", net="net-a")
    world.add_stray(job_id, "net-a", None, token="tok-0")
    world.add_stray(job_id, "net-a", None, token="tok-0.1")
    assert _strays(world) == [
        ("net-a", job_id, None, "tok-0"),
        ("net-a", job_id, None, "tok-0.1"),
    ]


def test_the_same_run_id_on_another_net_is_another_stray(world):
    """A stray holds the net it was recorded on: the same job and run id on a second net
    is that net's own stray, so that net too takes no job until it is settled."""
    job_id = world.enqueue("j", net="net-a")
    world.add_stray(job_id, "net-a", "nv-1")
    world.add_stray(job_id, "fixed", "nv-1")
    assert _strays(world) == [("net-a", job_id, "nv-1", None), ("fixed", job_id, "nv-1", None)]


def test_the_same_run_id_for_another_job_is_another_stray(world):
    """A stray names its job (a job with a stray waits in the queue): one job's run is
    never folded into another job's stray on the same net."""
    first = world.enqueue("first", net="net-a")
    second = world.enqueue("second", net="net-a")
    world.add_stray(first, "net-a", "nv-1")
    world.add_stray(second, "net-a", "nv-1")
    assert _strays(world) == [("net-a", first, "nv-1", None), ("net-a", second, "nv-1", None)]


def test_a_run_recorded_twice_is_one_stray(world):
    job_id = world.enqueue("first", net="net-a")
    world.add_stray(job_id, "net-a", None, token="tok-1")
    world.add_stray(job_id, "net-a", "nv-1", token="tok-1")
    world.add_stray(job_id, "net-a", "nv-1")
    with world.rt.sessions() as session:
        strays = session.query(StrayRun).all()
    assert [(s.nvflare_job_id, s.submit_token) for s in strays] == [("nv-1", "tok-1")]


def test_finishing_a_job_in_a_state_that_is_not_an_end_is_refused(world):
    """finish_job takes only terminal outcomes: a caller's bug is refused before any change."""
    job_id = world.enqueue("not-an-end", net="net-a")
    with world.rt.sessions.begin() as session, pytest.raises(ValueError) as refused:
        records.finish_job(
            session, job_id, JobState.RUNNING, "x", world.clock(), code=ReasonCode.RUN_FAILED
        )
    assert str(refused.value) == "RUNNING is not a terminal state"
    assert world.job(job_id).state == JobState.QUEUED

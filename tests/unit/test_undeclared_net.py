"""A net removed from the settings by a redeploy keeps its rows; its leftovers are settled
without asking a server nobody declares any more (and without crashing the loop)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from app.errors import ServerUnavailable
from app.settings import Settings
from app.usecases import (
    abort,
    dispatch,
    reconciler,
    services,
    undeclared,
    unknown_submit,
)
from models import JobState, NetState, StrayRun
from tests.fixtures.db import net_decl


def _redeploy_without_net_a(world, tmp_path, job_root) -> None:
    """NETS without net-a, and no process has declared it for the whole grace since."""
    world.clock.advance(services.undeclared_after_s(world.rt.settings) + 1)
    world.rt.settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "fixed", "static")]),
        PER_JOB_FL_SERVER="true",
    )


def test_an_unknown_submit_on_a_net_no_longer_declared_is_settled_as_a_stray(
    world, tmp_path, job_root
):
    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    world.server("net-a").submit_error = ServerUnavailable("no reply")
    with pytest.raises(ServerUnavailable):
        dispatch.dispatch(world.rt, job_id, "net-a", 0)
    _redeploy_without_net_a(world, tmp_path, job_root)

    assert unknown_submit.abandon_dispatch(world.rt, job_id, "submit outcome unknown")
    assert world.job(job_id).state == JobState.QUEUED
    with world.rt.sessions() as session:
        [stray] = session.scalars(select(StrayRun))
    assert (stray.net_name, stray.submit_token) == ("net-a", f"{job_id}-0")


def test_stray_runs_of_a_net_no_longer_declared_are_kept(world, tmp_path, job_root):
    job_id = world.enqueue("j", net="net-a")
    world.add_stray(job_id, "net-a", "nv-5")
    _redeploy_without_net_a(world, tmp_path, job_root)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1


def test_a_job_assigned_to_a_net_no_longer_declared_and_pinned_to_it_fails_at_once(
    world, tmp_path, job_root
):
    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)
    _redeploy_without_net_a(world, tmp_path, job_root)
    redriven = reconciler.reconcile(world.rt).redriven  # no deadline to wait out
    assert f"{job_id}: failed: pinned to an undeclared net" in redriven
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.FAILED, 0)
    assert job.last_error == undeclared.undeclared_reason("net-a")


def test_a_row_of_a_net_no_longer_declared_never_holds_up_a_claim(world, tmp_path, job_root):
    with world.rt.sessions.begin() as session:
        services.get_net(session, "net-a").state = NetState.READY  # first in the claim order
    _redeploy_without_net_a(world, tmp_path, job_root)
    job_id = world.enqueue("anywhere", required_sites=["site-1"])
    claims = dispatch.assign_jobs(world.rt)
    assert [(a.job_id, a.net_name) for a in claims] == [(job_id, "fixed")]

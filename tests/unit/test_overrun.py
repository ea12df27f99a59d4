"""A run past its net's maximum run time is aborted and its job FAILED; an abort the server
does not confirm must not leave the run going: a scale-to-zero net is taken down, an
always-on net keeps it as a stray run that blocks the net until it is settled."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from app.adapters.backend import AbortOutcome, AbortResult
from app.errors import UnknownAdminError
from app.settings import Settings
from app.usecases import dispatch, monitor
from models import JobState, NetState, StrayRun
from tests.fakes import FakeAdmin
from tests.fixtures.db import net_decl
from tests.unit.conftest import World
from tests.unit.scale_history import scale_decisions


def _overrunning(world, net: str):
    job_id = world.enqueue("j", net=net)
    world.run_pipeline(job_id)
    world.clock.advance(world.rt.settings.max_run_s + 1)
    return job_id


def _abort_fails(world, net: str) -> None:
    def unconfirmed(_: str):
        raise UnknownAdminError("odd reply")

    world.admin(net).abort = unconfirmed  # type: ignore[method-assign]


def _strays(world):
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def _stray_keys(world: World) -> list[tuple[str, str | None, str | None]]:
    """Each stray run's net, run id and submit token."""
    with world.rt.sessions() as session:
        return [
            (s.net_name, s.nvflare_job_id, s.submit_token) for s in session.query(StrayRun).all()
        ]


def test_a_confirmed_abort_fails_the_job_and_keeps_the_server(world):
    job_id = _overrunning(world, "net-a")
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)] == "failed: overran"
    job = world.job(job_id)
    assert job.state == JobState.FAILED
    # what NVFLARE last said of the run, and how the abort went
    assert job.last_error == "exceeded the maximum run time (NVFLARE RUNNING); abort: aborted"
    assert world.server("net-a").aborted == ["nv-1"]
    assert _strays(world) == []
    assert world.driver("net-a").replicas == 1  # idle now; scale-down waits for its grace


def test_an_unconfirmed_abort_on_a_scale_to_zero_net_takes_the_server_down(world):
    job_id = _overrunning(world, "net-a")
    _abort_fails(world, "net-a")
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.FAILED
    assert world.driver("net-a").replicas == 0  # the run died with its server
    assert world.net("net-a").state == NetState.STOPPED
    assert scale_decisions(world, "net-a")[-1] == (
        0,
        f"overrun of job {job_id} could not be aborted",
    )
    assert _strays(world) == []  # settled by the server going away


def test_an_unconfirmed_abort_on_an_always_on_net_leaves_a_stray_run_that_blocks_it(world):
    job_id = _overrunning(world, "fixed")
    _abort_fails(world, "fixed")
    monitor.monitor_running_jobs(world.rt)
    job = world.job(job_id)
    assert job.state == JobState.FAILED
    assert "not confirmed" in (job.last_error or "")
    [stray] = _strays(world)
    assert (stray.net_name, stray.job_id, stray.nvflare_job_id) == ("fixed", job_id, "nv-1")
    assert stray.reason == job.last_error
    assert world.drivers.get("fixed") is None or world.drivers["fixed"].calls == []
    world.enqueue("next", net="fixed")
    assert dispatch.claim_and_start(world.rt) == []  # no new job beside a run that may live


def test_an_overrun_whose_abort_the_server_runs_in_no_process_is_over(world, monkeypatch):
    # The server restarted under the overrunning job and cannot say how its run stands; the
    # abort's "not running" (nvflare 2.9's answer for a run killed with an earlier process)
    # is proof the run is over: nothing is kept, and the server stays up.
    job_id = _overrunning(world, "net-a")
    world.server("net-a").restart()

    def unreadable(_admin: FakeAdmin, _run: str):
        raise UnknownAdminError("odd reply")

    monkeypatch.setattr(FakeAdmin, "job_status", unreadable)
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)] == "failed: overran"
    job = world.job(job_id)
    assert job.state == JobState.FAILED
    assert (job.last_error or "").endswith("abort: not_running")
    assert _strays(world) == []
    assert world.driver("net-a").replicas == 1


def test_a_run_at_exactly_its_limit_is_not_an_overrun(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.clock.advance(world.rt.settings.max_run_s)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING


def test_a_nets_own_limit_wins_over_the_default(tmp_path, job_root, sqlite_factory, clock):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "net-a", "ecs", max_run_s=600)]),
        PER_JOB_FL_SERVER="true",
    )
    world = World(settings, sqlite_factory, clock)
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.clock.advance(601)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.FAILED


def test_an_aborting_job_is_left_to_the_abort_timeout_not_failed_as_an_overrun(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    _abort_fails(world, "net-a")
    assert world.abort(job_id) == JobState.ABORTING
    world.clock.advance(world.rt.settings.max_run_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.ABORTING


def test_status_errors_do_not_switch_off_the_run_time_limit(world):
    # tests/sim/FINDINGS.md, hole 3b
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)

    def unknown(_: str):
        raise UnknownAdminError("odd reply")

    world.admin("net-a").job_status = unknown  # type: ignore[method-assign]
    world.clock.advance(world.rt.settings.max_run_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.FAILED


@pytest.mark.parametrize("server_answer", ["unreachable for a moment", "abort accepted, not done"])
def test_an_overrun_whose_abort_is_not_confirmed_keeps_its_run_from_the_next_job(
    world, server_answer
):
    """A RUNNING job outlives MAX_RUN_S; monitor aborts it (`_stop_overrun`). The server
    either drops out for a moment (the real client answers NOTHING_TO_ABORT "server
    unavailable") or accepts the abort but the run is still RUNNING when asked. Either way
    `_stop_overrun` counts it as confirmed: job FAILED, net released, no stray, no take-down,
    so the next job is claimed onto the server that still runs the overrun.

    Breaks: "a run that no job counts (... an abort that was never confirmed) is a stray run:
    the net takes no new job until it is aborted ... or gone with its server"; the commit's own
    rule "a run is over only when its server, answering now, says so" (abort_on_server,
    settle_stray_runs) was not applied here."""
    job_id = world.enqueue("overrun", net="net-a")
    world.run_pipeline(job_id)
    run = world.job(job_id).nvflare_job_id
    server = world.server("net-a")
    if server_answer == "unreachable for a moment":
        # The start time is read, then the server drops out: status unknown, abort "nothing".
        server.on_start_time = lambda: setattr(server, "up", False)
    else:
        admin = world.admin("net-a")
        admin.abort = lambda _id: AbortResult(AbortOutcome.ABORTED)  # type: ignore[method-assign]
    world.clock.advance(world.rt.settings.max_run_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.FAILED
    server.up = True  # the blip is over: the overrun run is still there
    assert server.statuses[run] == "RUNNING"

    kept = any(nv == run for _, nv, _ in _stray_keys(world))
    taken_down = world.driver("net-a").replicas == 0
    assert kept or taken_down, "the overrun run is neither a stray nor gone with its server"

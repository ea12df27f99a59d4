"""A net's own `report_timeout_s` decides how long its FINISHING job waits for flip-api's
results report; a net without one waits REPORT_TIMEOUT_S."""

from __future__ import annotations

from app.usecases import monitor
from models import JobState, ReasonCode
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of


def test_each_net_holds_for_its_own_report_timeout(tmp_path, job_root, sqlite_factory, clock):
    nets = [
        net_decl(tmp_path, "quick", "ecs", report_timeout_s=60),
        net_decl(tmp_path, "slow", "ecs"),
    ]
    world = world_of(
        nets,
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        RELEASE_AFTER="reported",
        REPORT_TIMEOUT_S=3600,
    )
    jobs = {}
    for net in ("quick", "slow"):
        jobs[net] = world.enqueue(f"on-{net}", net=net)
        world.run_pipeline(jobs[net])
        world.server(net).statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert {world.job(j).state for j in jobs.values()} == {JobState.FINISHING}

    clock.advance(61)
    monitor.monitor_running_jobs(world.rt)
    quick, slow = world.job(jobs["quick"]), world.job(jobs["slow"])
    assert (quick.state, quick.reason_code) == (JobState.FAILED, ReasonCode.REPORT_TIMEOUT)
    assert slow.state == JobState.FINISHING

    clock.advance(3600)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(jobs["slow"]).state == JobState.FAILED
    assert world.rt.settings.report_timeout_for("quick") == 60
    assert world.rt.settings.report_timeout_for("gone") == 3600

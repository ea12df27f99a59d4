"""A housekeeping loop that fails on one net records it on that net (`last_error`, shown by
/fl/status and the CLI, naming the loop) and goes on with the other nets: an error nobody
classified, a misconfigured admin kit, or a report wait that cannot be settled."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.errors import AdminMisconfigured
from app.settings import Settings
from app.usecases import monitor, reconciler, records, scale_down
from models import JobState, NetState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of


def test_a_keep_alive_that_crashes_on_one_net_is_recorded_there_and_pings_the_others(
    tmp_path, job_root, sqlite_factory, clock
):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, n, "ecs") for n in ("net-a", "net-b")]),
        PER_JOB_FL_SERVER="true",
    )
    world = World(settings, sqlite_factory, clock)
    for name in ("net-a", "net-b"):
        world.run_pipeline(world.enqueue(f"job-{name}", net=name))

    def crash() -> None:
        raise RuntimeError("bug in a client")

    world.admin("net-a").ping = crash  # type: ignore[method-assign]
    assert scale_down.keep_alive_busy_nets(world.rt) == ["net-b"]
    assert world.net("net-a").last_error == "keep_alive_busy_nets: RuntimeError: bug in a client"
    assert world.net("net-b").last_error is None
    assert world.server("net-b").pings == 1


def test_an_idle_scale_down_that_crashes_on_one_net_is_recorded_there_and_stops_the_others(
    tmp_path, job_root, sqlite_factory, clock
):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps(
            [net_decl(tmp_path, n, "ecs", idle_timeout_s=60) for n in ("net-a", "net-b")]
        ),
        PER_JOB_FL_SERVER="true",
    )
    world = World(settings, sqlite_factory, clock)
    for name in ("net-a", "net-b"):
        job_id = world.enqueue(f"job-{name}", net=name)
        world.run_to_completion(job_id)
    world.clock.advance(60)

    def crash(replicas: int) -> None:
        raise RuntimeError("bug in a driver")

    world.driver("net-a").scale = crash  # type: ignore[method-assign]
    assert scale_down.scale_down_idle_nets(world.rt) == ["net-b"]
    assert world.net("net-a").last_error == "scale_down_idle_nets: RuntimeError: bug in a driver"
    assert world.net("net-b").state == NetState.STOPPED


def test_a_redrive_that_crashes_is_recorded_on_its_net_and_the_others_go_on(
    tmp_path, job_root, sqlite_factory, clock
):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, n, "ecs") for n in ("net-a", "net-b")]),
        PER_JOB_FL_SERVER="true",
        ABORT_TIMEOUT_S=3600,  # stuck, not expired: the abort is re-sent
    )
    world = World(settings, sqlite_factory, clock)
    jobs = {}
    for name in ("net-a", "net-b"):
        jobs[name] = world.enqueue(f"job-{name}", net=name)
        world.run_pipeline(jobs[name])
        with world.rt.sessions.begin() as session:
            records.abort_job(session, jobs[name], "user", world.clock())  # ABORTING
    world.clock.advance(world.rt.settings.stuck_after_s + 1)
    real_send = world.outbox.send

    def send(task: str, **kwargs):
        if kwargs.get("job_id") == str(jobs["net-a"]):
            raise RuntimeError("broker bug")
        return real_send(task, **kwargs)

    world.outbox.send = send  # type: ignore[method-assign]
    redriven = reconciler.reconcile(world.rt).redriven
    assert redriven == (f"{jobs['net-b']}: abort re-sent",)
    assert world.net("net-a").last_error == "reconcile: RuntimeError: broker bug"


def test_one_net_misconfigured_admin_does_not_stop_monitoring_of_another(world):
    # tests/sim/FINDINGS.md, hole 1: net "fixed" (static, first by name) raises
    # AdminMisconfigured on every probe; the job on net-a must still settle.
    on_fixed = world.enqueue("f", net="fixed")
    world.run_pipeline(on_fixed)
    on_a = world.enqueue("a", net="net-a")
    world.run_pipeline(on_a)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"

    def broken() -> float:
        raise AdminMisconfigured("admin certificate expired")

    world.admin("fixed").server_start_time = broken  # type: ignore[method-assign]
    monitor.monitor_running_jobs(world.rt)
    assert world.job(on_a).state == JobState.COMPLETED
    assert "expired" in (world.net("fixed").last_error or "")


def test_an_unclassified_error_on_one_net_never_escapes_a_housekeeping_loop(world):
    job_id = world.enqueue("a", net="net-a")
    world.run_pipeline(job_id)

    def boom() -> None:
        raise RuntimeError("something nobody classified")

    world.admin("net-a").ping = boom  # type: ignore[method-assign]
    assert scale_down.keep_alive_busy_nets(world.rt) == []
    world.admin("net-a").server_start_time = boom  # type: ignore[method-assign]
    monitor.monitor_running_jobs(world.rt)
    assert "RuntimeError" in (world.net("net-a").last_error or "")


def test_a_report_wait_that_cannot_be_settled_stops_no_other_nets_monitoring(
    tmp_path, job_root, sqlite_factory, clock, monkeypatch
):
    """app/usecases/README.md "Guarantees": every housekeeping loop handles each net on its
    own, one net's failure "is logged, counted and written to that net's last_error, and
    never stops the other nets". monitor_running_jobs first settles the overdue FINISHING
    jobs (report_waits.expire_report_waits, every FINISHING row since the rewrite) outside
    any per-net isolation: one that fails to settle raises out of the round before any net's run is
    watched, every round, so a finished run on another net is never settled."""
    nets = [net_decl(tmp_path, n, "ecs", report_timeout_s=60) for n in ("net-a", "net-b")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock, RELEASE_AFTER="reported")
    waiting = world.enqueue("waiting", net="net-a")
    world.run_pipeline(waiting)
    world.server("net-a").statuses[world.job(waiting).nvflare_job_id] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(waiting).state == JobState.FINISHING
    clock.advance(61)  # its report is overdue
    running = world.enqueue("running", net="net-b")
    world.run_pipeline(running)
    world.server("net-b").statuses[world.job(running).nvflare_job_id] = "FINISHED:COMPLETED"

    def bad_row(*_args: Any, **_kw: Any) -> bool:
        raise RuntimeError("bug settling one report wait")

    monkeypatch.setattr(records, "expire_report_wait", bad_row)
    try:
        monitor.monitor_running_jobs(world.rt)
    except RuntimeError as exc:
        pytest.fail(f"one FINISHING row stopped the whole monitor round: {exc}")
    assert world.job(running).state == JobState.FINISHING  # net-b's run was watched
    # Recorded on its own net, under the loop's name (as /fl/status and the CLI show it).
    assert world.net("net-a").last_error == (
        "monitor_running_jobs: RuntimeError: bug settling one report wait"
    )
    assert world.net("net-b").last_error is None


def test_a_net_repair_that_crashes_is_recorded_on_its_net_and_reports_no_repair(world):
    """reconcile's repair of net-a raises an error nobody classified: it is net-a's
    `last_error`, and the round's report lists no repair for it."""

    def boom() -> Any:
        raise RuntimeError("driver bug")

    world.driver("net-a").observe = boom  # type: ignore[method-assign]
    repaired = reconciler.reconcile(world.rt).repaired
    assert [note for note in repaired if note.startswith("net-a")] == []
    assert world.net("net-a").last_error == "reconcile: RuntimeError: driver bug"

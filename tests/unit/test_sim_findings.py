"""What the simulator's sweep found beyond issue 20's eight defects, each as a minimal
reproduction on the use cases; an open one is a strict xfail with what it shows."""

from __future__ import annotations

import json

import pytest

from app.settings import Settings
from app.usecases import abort, dispatch, reconciler, services
from models import JobState
from tests.fixtures.db import net_decl


def _redeploy_without_net_a(world, tmp_path, job_root) -> None:
    # ... and no process has declared net-a for the whole grace since (the deploy is over).
    world.clock.advance(services.undeclared_after_s(world.rt.settings) + 1)
    world.rt.settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "fixed", "static")]),
        PER_JOB_FL_SERVER="true",
    )
    # The redeploy restarts the workers: no adapter built from the old settings survives.
    world.rt._admins.clear()
    world.rt._drivers.clear()


@pytest.mark.parametrize("step", ["start", "check_ready", "dispatch"])
def test_a_chain_step_for_a_net_a_redeploy_removed_ends_its_chain(world, tmp_path, job_root, step):
    """The chain of a job claimed onto net-a is in flight when a redeploy drops net-a from
    NETS: its next step must end the chain (reconcile settles the job), not raise an
    unclassified KeyError (Celery's "raised unexpected", a traceback per step)."""
    job_id = world.enqueue("j", net="net-a")
    if step == "dispatch":
        world.run_until_ready(job_id)
    else:
        [claim] = dispatch.assign_jobs(world.rt)
        assert claim.net_name == "net-a"
        if step == "check_ready":
            dispatch.scale_up(world.rt, job_id, "net-a", 0)
    _redeploy_without_net_a(world, tmp_path, job_root)

    result = getattr(dispatch, step)(world.rt, job_id, "net-a", 0)

    assert result.step.ends_chain
    assert result.detail == "net net-a is no longer declared (NETS)"
    assert world.job(job_id).state != JobState.RUNNING


def test_an_abort_in_flight_for_a_net_a_redeploy_removed_leaves_the_job_to_reconcile(
    world, tmp_path, job_root
):
    """flip-api aborts a RUNNING job on net-a; the redeploy that drops net-a lands before the
    worker runs abort_on_server: it must leave the job to reconcile (fix 7 aborts it), not
    raise KeyError."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        services.abort_job(session, job_id, "user", world.clock())
    _redeploy_without_net_a(world, tmp_path, job_root)

    assert abort.abort_on_server(world.rt, job_id) in (JobState.ABORTING, JobState.ABORTED)


def test_a_bundle_rebuilt_with_fixed_mtimes_is_prepared_afresh(tmp_path):
    """A job folder unpacked from a zip (every mtime 1980-01-01) or built with a fixed
    `tar --mtime` is replaced between two attempts by one whose config differs by a digit:
    the second attempt must submit the new content (fix 2's promise), not the first copy."""
    import os
    import uuid

    from app.adapters.jobdefs import prepare

    bundle = tmp_path / "jobs" / "fedavg"
    (bundle / "app" / "config").mkdir(parents=True)
    config = bundle / "app" / "config" / "config_fed_server.json"
    fixed_ns = 315_532_800 * 10**9

    def build(rounds: int) -> None:
        (bundle / "meta.json").write_text('{"deploy_map": {"app": ["@ALL"]}}')
        config.write_text(f'{{"num_rounds": {rounds}}}')
        for path in (bundle / "meta.json", config):
            os.utime(path, ns=(fixed_ns, fixed_ns))

    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=tmp_path / "jobs")
    job_id = uuid.uuid4()
    build(5)
    first = prepare(settings, bundle, job_id, ["site-1"], None)
    build(6)  # the next attempt's bundle: one digit changed, same size, same mtimes
    second = prepare(settings, bundle, job_id, ["site-1"], None)

    assert (second / "app" / "config" / "config_fed_server.json").read_text() == (
        '{"num_rounds": 6}'
    ), f"submitted from {first}"


def test_a_net_declared_again_takes_no_job_beside_the_run_it_was_removed_with(
    world, tmp_path, job_root
):
    """net-a runs job `old` when a redeploy removes it from NETS; reconcile fails `old` (its
    run may live on a server nothing watches). A second redeploy declares net-a again while
    that run still lives: net-a must take no job beside it (one live run per server)."""
    declared = world.rt.settings
    old = world.enqueue("old", net="net-a")
    world.run_pipeline(old)
    _redeploy_without_net_a(world, tmp_path, job_root)
    reconciler.reconcile(world.rt)
    assert world.job(old).state == JobState.FAILED
    world.rt.settings = declared  # net-a declared again; its server still runs `old`'s run
    world.rt._admins.clear()
    world.rt._drivers.clear()
    new = world.enqueue("new", net="net-a")

    claims = dispatch.assign_jobs(world.rt)

    assert [c.job_id for c in claims if c.net_name == "net-a"] == [], (
        f"job {new} claimed onto net-a beside run {world.job(old).nvflare_job_id}"
    )


@pytest.mark.parametrize("seed", [231, 1025, 1157])
def test_the_long_sweeps_findings_stay_fixed(seed):
    """Seeds of the 200-2000 sweep that reported a violation before their fix (app/sim/
    FINDINGS.md): 231 the checker timing a net's grace from its stop rather than from a
    server scaled up by hand, 1025 a stale wait_ready raising for a net it did not mark,
    1157 no human redeploying an always-on net whose server failed to start."""
    from app.sim.simulation import run_seed

    result = run_seed(seed)
    assert [v.invariant for v in result.violations] == []

"""What every reconcile round tidies besides the nets: the stray runs of every net that has
some (each net counted on its own), and the prepared job copies of jobs no longer active."""

from __future__ import annotations

from app.usecases import dispatch, reconciler, records
from models import JobState, ReasonCode


def test_the_stray_runs_of_every_net_are_settled(world):
    for net in ("net-a", "fixed"):
        job_id = world.enqueue(f"j-{net}", net=net)
        world.add_stray(job_id, net, f"nv-{net}")
        world.server(net).statuses[f"nv-{net}"] = "RUNNING"
    world.driver("net-a").replicas = 1
    reconciler.reconcile(world.rt)
    assert world.server("net-a").aborted == ["nv-net-a"]
    assert world.server("fixed").aborted == ["nv-fixed"]


def test_prepared_copies_of_jobs_no_longer_active_are_removed(world):
    prepared = world.rt.settings.data_dir.resolve() / "prepared"
    done = world.enqueue("done", net="net-a")
    world.run_to_completion(done)
    running = world.enqueue("running", net="fixed")
    world.run_pipeline(running)
    assert {p.name for p in prepared.iterdir()} == {str(done), str(running)}
    reconciler.reconcile(world.rt)
    assert {p.name for p in prepared.iterdir()} == {str(running)}
    assert dispatch.claim_and_start(world.rt) == []


def test_a_folder_there_that_is_no_jobs_copy_does_not_stop_the_sweep(world):
    prepared = world.rt.settings.data_dir.resolve() / "prepared"
    done = world.enqueue("done", net="net-a")
    world.run_to_completion(done)
    (prepared / "lost+found").mkdir()  # not named for a job
    reconciler.reconcile(world.rt)
    assert str(done) not in {p.name for p in prepared.iterdir()}


def test_reconcile_keeps_the_prepared_copy_of_a_job_that_may_be_claimed_again(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    folder = world.server("net-a").folders[-1]
    with world.rt.sessions.begin() as session:
        records.requeue_job(session, job_id, "server restarted", world.clock())
    reconciler.reconcile(world.rt)  # QUEUED: not active, but not over either
    assert folder.is_dir()
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session, job_id, JobState.ABORTED, "user", world.clock(), code=ReasonCode.ABORTED
        )
    reconciler.reconcile(world.rt)
    assert not folder.exists()


def test_the_live_jobs_answered_are_only_those_asked_about(world):
    """`_live_jobs` (the prepared copies' and cached bundles' sweep): of the jobs it is given,
    those not ended; another live job is not read."""
    asked = world.enqueue("asked", net="net-a")
    world.enqueue("other", net="net-a")
    assert reconciler._live_jobs(world.rt, {asked}) == {asked}

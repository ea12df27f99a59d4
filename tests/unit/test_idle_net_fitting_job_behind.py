"""A net that declares its sites, idle with a QUEUED job it could run waiting behind 60 jobs
that need a site it lacks (they wait for the one net that has it); review 20.

The claim looked through only the net's next 50 jobs and took none, while the idle scale-down
asked `claims.queued_job_fits`, which read every QUEUED job, found the one that fits and kept
the server: the free server was neither used nor scaled down for as long as the jobs ahead
waited for the busy net (a run each), the fitting job's view saying `claim pending`. Both
now ask the database whether a job's sites fit (`app.usecases.site_fit`)."""

from __future__ import annotations

from app.usecases import dispatch, scale_down
from models import JobState, NetState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of


def _idle_net_b_behind_a_long_queue(tmp_path, job_root, sqlite_factory, clock) -> tuple[World, str]:
    """net-a (site-1..3) runs a job; net-b (site-1, site-2) is READY and idle; 60 jobs
    needing site-3 wait for net-a; then one job that net-b could run is enqueued."""
    nets = [
        net_decl(tmp_path, "net-a", "ecs", sites=["site-1", "site-2", "site-3"]),
        net_decl(tmp_path, "net-b", "ecs", sites=["site-1", "site-2"], idle_timeout_s=60),
    ]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    warm = world.enqueue("warms-net-b", net="net-b")
    world.run_to_completion(warm)  # net-b READY, its server up, idle from now
    busy = world.enqueue("holds-net-a", net="net-a")
    world.run_pipeline(busy)  # net-a BUSY for a long run
    for i in range(60):  # more than the 50 the claim once looked through
        world.enqueue(f"needs-site-3-{i}", required_sites=["site-3"])
    fits = world.enqueue("fits-net-b", required_sites=["site-1"])
    assert world.net("net-b").state == NetState.READY
    return world, fits


def test_an_idle_net_is_used_or_scaled_down_when_its_only_fitting_job_waits_behind_60(
    tmp_path, job_root, sqlite_factory, clock
):
    """README: the dispatcher "scales the server back to zero after an idle grace period"
    (FlDispatcherIdleServerPastGrace: "the server is paid for idle"); app/usecases/README.md,
    The claim's order: a claim takes a free net "and gives it the first job of this order
    among the QUEUED jobs that may run on it". Here, for an hour of beat rounds, net-b is
    neither given the job that fits it nor scaled down."""
    world, fits = _idle_net_b_behind_a_long_queue(tmp_path, job_root, sqlite_factory, clock)
    for _ in range(60):  # an hour of beat rounds, net-a's run going on
        world.clock.advance(60)
        dispatch.claim_and_start(world.rt)
        scale_down.scale_down_idle_nets(world.rt)
    used = world.job(fits).state != JobState.QUEUED
    stopped = world.net("net-b").state in (NetState.STOPPING, NetState.STOPPED)
    assert used or stopped, (
        f"net-b {world.net('net-b').state} with its server up "
        f"(replicas={world.driver('net-b').replicas}) an hour past its 60 s grace, "
        f"and the job that fits it still {world.job(fits).state}"
    )

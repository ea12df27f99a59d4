"""Monitor and keep-alive talk to each net's server on its own: a hung server costs a round
its deadline, never the other nets their turn. Real threads (app.parallel.Prober), fakes for
the servers; a hung fake blocks until the test lets it go, so a round that waited for it
would never return."""

from __future__ import annotations

import json
import threading
import time

from app.parallel import Prober
from app.settings import Settings
from app.usecases import monitor
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World

HUNG = ("net-c", "net-e")


def test_a_hung_server_never_holds_up_the_other_nets(tmp_path, job_root, sqlite_factory, clock):
    names = ["net-a", "net-b", "net-c", "net-d", "net-e"]
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, n, "ecs") for n in names]),
        PER_JOB_FL_SERVER="true",
        ADMIN_COMMAND_TIMEOUT_S=0.5,
    )
    world = World(settings, sqlite_factory, clock)
    jobs = {}
    for name in names:
        jobs[name] = world.enqueue(f"job-{name}", net=name)
        world.run_pipeline(jobs[name])
        world.server(name).statuses["nv-1"] = "FINISHED:COMPLETED"
    release = threading.Event()
    for name in HUNG:
        admin = world.admin(name)

        def hang(*_args, _real=admin.server_start_time):
            release.wait(30)
            return _real()

        admin.server_start_time = hang  # type: ignore[method-assign]
        admin.ping = hang  # type: ignore[method-assign]
    # Three slots for two hung servers: one always stays free for the healthy nets.
    world.rt.fan_out = prober = Prober(max_parallel=3)
    try:
        outcomes = monitor.monitor_running_jobs(world.rt)
        for name in names:
            if name in HUNG:
                assert "not watched this round" in outcomes[str(jobs[name])]
                assert world.job(jobs[name]).state == JobState.RUNNING
            else:
                assert world.job(jobs[name]).state == JobState.COMPLETED
        # The next round does not start a second call on a net whose first one still hangs.
        again = monitor.monitor_running_jobs(world.rt)
        assert "still running" in again[str(jobs["net-c"])]
    finally:
        release.set()
        # The hung probes end (writing their verdicts) before the test does: one left running
        # would write into the next test's database (tests/fixtures/db.py: one engine).
        deadline = time.monotonic() + 10
        while prober.hung() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert prober.hung() == []

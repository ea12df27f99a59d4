"""The monitor's grace under a verdict a worker start keeps on a net under a job
(`nets.misconfigured_after_job`): a start that finds the files fixed restarts it (the calls
it counted were never made, test_nothing_sent_through_files_found_wrong.py), but a start
that finds them still wrong changes nothing the grace counts, so it keeps counting.

Found by the simulator (tests/sim/FINDINGS.md, Round 14: ops 4550, drift 8187): workers
restarting every 15-30 s with a net's kit still wrong cleared `unreachable_since` each time,
so the grace never ran out; a job whose run had ended, or whose server had died, stayed
RUNNING or ABORTING until a human fixed the kit."""

from __future__ import annotations

from typing import Any

import pytest

from app.usecases import monitor
from models import JobState
from tests.unit.conftest import World
from tests.unit.test_start_verdict_under_a_job import _start_with_wrong_files

pytestmark = pytest.mark.unit


def test_a_restart_with_the_files_still_wrong_does_not_restart_the_grace(
    world: World, sqlite_url: str, monkeypatch: Any
) -> None:
    """A job RUNNING on net-a when a start finds its kit wrong; the next round starts the
    grace (30 s here). 20 s in, a second round, then a worker restarts and finds the kit
    still wrong; 15 s later the grace has run 35 s over three rounds: the job is lost
    (requeued), as with no restart at all."""
    job_id = world.enqueue("running", net="net-a")
    world.run_pipeline(job_id)
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    monitor.monitor_running_jobs(world.rt)  # the grace starts
    world.clock.advance(20)
    monitor.monitor_running_jobs(world.rt)  # a second failed round (SERVER_LOST_ROUNDS)
    _start_with_wrong_files(world, sqlite_url, monkeypatch)  # still wrong
    assert world.net("net-a").unreachable_rounds == 2  # kept as well
    assert world.net("net-a").misconfigured_after_job is not None
    world.clock.advance(15)
    outcome = monitor.monitor_running_jobs(world.rt)[str(job_id)]
    # Before: "server not answering for 0s", the grace restarted by the start.
    assert outcome == "requeued"
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 1)

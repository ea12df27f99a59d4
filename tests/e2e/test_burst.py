"""Under a burst of enqueues, beat's housekeeping still runs on time (issue 20): a real
worker on flip-api's queue and the chains', a real housekeeper worker on beat's queue (the
compose layout), a real beat, a private Redis and PostgreSQL. A burst that takes several
housekeeping intervals to drain is sent as flip-api sends it; every message beat sent
meanwhile must have started within one interval of being sent (beat's own deadline: it
drops a message that waited longer), and the kicks the burst caused must be a handful, not
one per enqueue. Before the queues were split, most of beat's messages expired unrun behind
such a burst (27 of 31 in the issue's measurement)."""

from __future__ import annotations

import pytest

from tests.fixtures.burst import SPLIT, burst_stack, settle

pytestmark = pytest.mark.e2e

EXPECTED_S = 50  # seconds on the 2-core CI machine (tests/tools/schedule.py)

INTERVAL_S = 2.0
# The point is a backlog: the drain must outlast a few intervals, or beat had no backlog to
# wait behind and the test would pass on the old single queue too. 2,000 drain in about 22 s
# on the quiet 2-core machine (3,000 took 36 s, 80 s under the test command's load), about
# 9 s on one 2.4 times faster: still three intervals.
JOBS = 2000
MIN_DRAIN_INTERVALS = 3


def test_beat_runs_within_one_interval_while_a_burst_drains(tmp_path):
    with burst_stack(tmp_path / "burst", SPLIT, INTERVAL_S) as (stack, events):
        burst = stack.burst(JOBS, timeout_s=600, drain_cap_s=120)
        settle(burst.end, INTERVAL_S)
        beat = events.lateness(burst.send_start, burst.end, INTERVAL_S)
        kicks = events.kicks(burst.send_start, burst.end)

    print(f"\nburst: {JOBS} jobs drained in {burst.drain_s:.1f} s")
    assert burst.drain_s >= MIN_DRAIN_INTERVALS * INTERVAL_S, (
        f"the burst drained in {burst.drain_s:.1f} s: no backlog to test against"
    )
    assert burst.drained is not None, f"{burst.left} messages still queued"
    summary = {
        name: (entry.sent, len(entry.started_s), entry.late, entry.max_s)
        for name, entry in beat.items()
    }
    # Every interval entry was sent while the burst drained, and each one ran in time.
    for name, entry in beat.items():
        if name.endswith("keep_alive_busy_nets"):
            continue  # every KEEP_ALIVE_INTERVAL_S (300 s): none fall in the window
        assert entry.sent >= 2, (name, summary)
        assert entry.late == 0, (name, summary)  # each started within one interval
    # Coalesced: one kick while one is pending, not one per enqueue (JOBS before).
    assert kicks <= JOBS // 10, kicks

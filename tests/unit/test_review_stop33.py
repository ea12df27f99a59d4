"""Review of the stop33 rewrites (claims._use_holds, monitor._after_restart/_verdict,
monitor._expire_report_waits, settings._check_webhook_secret): README promises attacked at
the boundaries and on the error paths those rewrites touched."""

from __future__ import annotations

from typing import Any

import pytest

from app.usecases import monitor, services
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of
from tests.unit.test_prewarm import held_ready, pw, row, view  # noqa: F401 (pw: a fixture)

# --- prewarm holds: a claim and a hint at the same instant ----------------------------------


# --- monitor: a restarted server's verdict on the status just read ---------------------------


# --- monitor: the report-wait expiry and the other nets' runs -------------------------------


def test_review33_a_report_wait_that_cannot_be_settled_stops_no_other_nets_monitoring(
    tmp_path, job_root, sqlite_factory, clock, monkeypatch
):
    """README "Guarantees": every housekeeping loop handles each net on its own, one net's
    failure "is logged, counted and written to that net's last_error, and never stops the
    other nets". monitor_running_jobs first settles the overdue FINISHING jobs
    (_expire_report_waits, every FINISHING row since the rewrite) outside any per-net
    isolation: one that fails to settle raises out of the round before any net's run is
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

    monkeypatch.setattr(services, "expire_report_wait", bad_row)
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


# --- settings: a whsec_ secret with a character base64 does not know ------------------------

"""Review of the stop33 rewrites (claims._use_holds, monitor._after_restart/_verdict,
monitor._expire_report_waits, settings._check_webhook_secret): README promises attacked at
the boundaries and on the error paths those rewrites touched."""

from __future__ import annotations

from typing import Any

import pytest

from app.schemas import PrewarmNet
from app.usecases import dispatch, monitor, prewarm, prewarm_warm_up, services
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of
from tests.unit.test_prewarm import held_ready, pw, row, view  # noqa: F401 (pw: a fixture)

# --- prewarm holds: a claim and a hint at the same instant ----------------------------------


def test_review33_a_hint_made_just_after_a_claim_is_not_used_by_that_claim(pw):  # noqa: F811
    """README "Prewarm": a hold ends "when a job is claimed onto its net"; a job claimed
    before the hint did not use it (test_a_busy_net_is_held_after_its_job_until_the_deadline).
    The claim itself ends the holds open at that moment (claims._use_holds); a hint that
    arrives after the claim, at the same instant, is not among them and must stay held for
    the next job. prewarm_holds.settle_row counts a job assigned at the hold's creation
    instant (`assigned_at >= created_at`) as its use: the hint ends at once, `used` by a job
    that was claimed before it existed, and the net is let go after that job's grace
    instead of being held to the hint's deadline."""
    job_id = pw.enqueue("before", net="net-a")
    assert dispatch.assign_jobs(pw.rt)  # claimed at T: net-a STARTING for it
    prewarm.request_prewarm(pw.rt, PrewarmNet(caller_key="p1", net="net-a", within_s=300))
    assert row(pw, "p1").outcome is None  # the claim came first: it did not end this hold
    prewarm_warm_up.settle_prewarms(pw.rt)  # a scale-down round, still at T
    settled = row(pw, "p1")
    assert (settled.outcome, settled.job_id) == (None, None), (
        f"a hint made after job {job_id}'s claim was settled {settled.outcome} by it"
    )


def test_review33_a_prewarm_read_as_expired_at_its_deadline_never_reads_used_after(pw):  # noqa: F811
    """README "Prewarm": `status` is warming/held, "then used, expired, cancelled or
    failed": an ended prewarm keeps its outcome. At the hold's deadline instant T,
    GET /prewarms (prewarm.status_of: `hold_until <= now`) already reads it `expired`; a
    claim at that same T once ended it `used` (claims._use_holds had `hold_until >= now`),
    so a caller that read `expired` read `used` a moment later at the same clock. One rule
    now: a hold is live on [created_at, hold_until)."""
    held_ready(pw, within_s=100)
    pw.enqueue("on-time", net="net-a")
    pw.clock.now = row(pw, "p1").hold_until
    before = view(pw, "p1")["status"]
    assert dispatch.assign_jobs(pw.rt)
    after = view(pw, "p1")["status"]
    assert after == before, f"read {before!r} at its deadline, then {after!r} at the same instant"


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

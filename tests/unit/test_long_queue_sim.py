"""The sweep reaches 0e920a5 (review 20 B) through `tests.sim.long_queue`'s band worlds: a
net that declares its sites, free, with a QUEUED job it may run behind 55-60 jobs needing a
site only another (busy) net has.

- 0e920a5: a claim asks the job's sites in its statement (`site_fit`), so it gives a sited
  net the first job of its order that fits, wherever it waits. Undone (the claim of before,
  which looked through the net's next `SITES_SCAN` = 50 QUEUED jobs and took none that
  fitted among them; the idle check, `queued_job_fits`, read every job and kept the server
  up): the fitting job waits past the checker's bound while a net it fits is free
  (`queued-while-free`, whose free nets are those the job's sites fit).

With the fix undone its seeds report; the same seeds are clean with it, and with the fix
undone report nothing where the band never comes (`BANDS` empty). Seeds 0-2000's 90 band
worlds: 53 report with the fix undone; with it 1, misconfig 1339, not the claim's (a backlog;
tests/sim/FINDINGS.md, Round 20)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from sqlalchemy.orm import Session

from app.net_config import NetConfig
from app.project_shares import Shares
from app.usecases import claims
from models import Job
from tests.sim import long_queue
from tests.sim.sweep import run_seeds
from tests.unit.test_simulation_safeguards import Safeguard, safeguard_tests

pytestmark = pytest.mark.unit

FINDS = frozenset({"queued-while-free"})
SITES_SCAN = 50  # the claim's look-ahead before 0e920a5


def _scan_of_fifty(mp: pytest.MonkeyPatch) -> None:
    # 0e920a5 undone: a sited net's claim reads its next 50 jobs (unlocked), takes the first
    # whose sites it has (locked by id, the same conditions read again), else none.
    real = claims._next_job_for

    def before(session: Session, net: NetConfig, shares: Shares, aged_before: datetime) -> Any:
        if net.sites is None:
            return real(session, net, shares, aged_before)
        params = {"net": net.name, "aged_before": aged_before}
        queue = claims.queue_for_net(shares)
        for job in session.scalars(queue.limit(SITES_SCAN), params).all():
            if net.lacks(job.required_sites):
                continue
            locked = session.scalar(
                queue.where(Job.id == job.id).limit(1).with_for_update(skip_locked=True, of=Job),
                params,
            )
            if locked is not None:
                return locked
        return None

    mp.setattr(claims, "_next_job_for", before)


CASES = [
    Safeguard(
        "a sited net is given the job that fits it behind 50 that do not (0e920a5)",
        _scan_of_fifty,
        "racy",
        # Racy 282 (round 20); since round 21 (the callback receiver's rests), 363 (the
        # first of the racy band worlds of 0-10,000).
        range(363, 364),
        FINDS,
    ),
]


test_the_sweep_finds_the_long_queue_fix_undone, test_the_same_seeds_are_clean_with_the_fix = (
    safeguard_tests(CASES, timeout_s=600)
)


def test_without_the_band_the_same_seeds_report_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """It is the band's long queue that reaches the 50-job scan: no band, no report."""
    _scan_of_fifty(monkeypatch)
    monkeypatch.setattr(long_queue, "BANDS", ())
    seeds = CASES[0].seed_list()
    seen = {r.seed: [v.line() for v in r.violations] for r in run_seeds(seeds)}
    assert seen == {seed: [] for seed in seeds}

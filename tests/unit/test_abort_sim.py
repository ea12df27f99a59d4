"""The sweep reaches review 21b's D1 and D2 (29fb0ed, with 55106cc's lookup that ends
nothing) through `tests.sim.abort_blip`'s band worlds: one more job, sent once the faults
stopped and pinned to an NVFLARE net, whose abort meets one error (BLIP) or comes as its
submit's reply is lost (LOST); `abort-unconfirmed-while-answering` (tests.sim.
abort_invariants) reports a job its user aborted that ends `abort_unconfirmed`, a run of it
live meanwhile, while its server answered throughout.

- D1 (`reconciler._redrive_stuck_jobs`): an ABORTING job's abort is re-sent each reconcile
  round once it is one HOUSEKEEPING_INTERVAL_S old. Undone (re-sent only past STUCK_AFTER_S):
  with STUCK_AFTER_S = ABORT_TIMEOUT_S, as the defaults have them (BLIP worlds), an abort met
  by one error is never sent again, and the run trains until the abort expires.
- D2 (`abort.abort_on_server`): a job whose submit no worker holds any more and whose run id
  was never learnt has its run looked up by the attempt's token and aborted. Undone (every
  such job taken as held by its submit, as before: "dispatch() sends the abort when it
  lands", which it never does), the run trains until the abort expires.

Seeds 0-3000's 107 band worlds (tests/sim/FINDINGS.md, Round 22): 64 BLIP (56 play it; the
others' job is refused, its net removed by a redeploy, or its abort refused by a poison
row), 43 LOST. D1 undone: 56 report; D2 undone: 43; with both fixes none. With either
undone and the band off (`BANDS` empty) the same seeds report nothing."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from app.runtime import Runtime
from app.usecases import abort, reconciler
from app.usecases.step_leases import Leased
from models import JobState
from tests.sim import abort_blip
from tests.sim.sweep import run_seeds
from tests.unit.test_simulation_safeguards import Safeguard, safeguard_tests

pytestmark = pytest.mark.unit

FINDS = frozenset({"abort-unconfirmed-while-answering"})


def _resent_past_stuck_only(mp: pytest.MonkeyPatch) -> None:
    # D1 undone: an ABORTING job no older than STUCK_AFTER_S (and not expired) is left alone,
    # as before 29fb0ed (re-sent past STUCK_AFTER_S, expired past ABORT_TIMEOUT_S).
    real = reconciler._redrive_stuck_jobs

    def before(rt: Runtime, now: datetime, jobs: list[Leased]) -> Any:
        young_s = min(rt.settings.stuck_after_s, rt.settings.abort_timeout_s)
        kept = [
            j
            for j in jobs
            if j.state != JobState.ABORTING or (now - j.changed_at).total_seconds() > young_s
        ]
        return real(rt, now, kept)

    mp.setattr(reconciler, "_redrive_stuck_jobs", before)


def _submit_always_held(mp: pytest.MonkeyPatch) -> None:
    # D2 undone: an ABORTING job with no run id is always taken as held by its submit's
    # worker (abort_on_server returns ABORTING), as before 29fb0ed.
    mp.setattr(abort, "lapsed", lambda _due, _now: False)


CASES = [
    Safeguard(
        "an abort met by one error is sent again before it expires (29fb0ed D1)",
        _resent_past_stuck_only,
        "clean",
        range(837, 838),  # BLIP (round 22)
        FINDS,
    ),
    Safeguard(
        "an abort of a submit whose reply was lost finds its run by token (29fb0ed D2)",
        _submit_always_held,
        "ops",
        range(968, 969),  # LOST (round 22)
        FINDS,
    ),
]


test_the_sweep_finds_the_abort_fixes_undone, test_the_same_seeds_are_clean_with_the_fixes = (
    safeguard_tests(CASES, timeout_s=600)
)


@pytest.mark.parametrize("safeguard", CASES, ids=lambda s: s.name)
def test_without_the_band_the_same_seeds_report_nothing(
    safeguard: Safeguard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It is the band's job that reaches each fix: no band, no report."""
    safeguard.switch_off(monkeypatch)
    monkeypatch.setattr(abort_blip, "BANDS", ())
    seeds = safeguard.seed_list()
    seen = {r.seed: [v.line() for v in r.violations] for r in run_seeds(seeds)}
    assert seen == {seed: [] for seed in seeds}

"""The sweep reaches round 23's link check (90ba4c8, 3bd81e2) through `tests.sim.link_out`'s
band worlds: the job folder under JOB_ROOT gets, for a while, a link in `app/config/` to a
file outside JOB_ROOT holding a marker; `nothing-from-outside-root` reports a submitted
folder holding it (or a copy prepared while the link was there, submitted).

- `bundle_copy.entries` refuses a bundle with an entry whose real path lies outside its root
  (`_within`): the job ends FAILED `definition_invalid`. Undone (every path taken as within),
  the linked file is copied into the prepared job and submitted (clean 189).

Seeds 0-3000's 157 band worlds (tests/sim/FINDINGS.md, "Round 23 (links out)"): with the
fix undone 98 report, the 98 whose local job was dispatched while the link was there; with
it none. With the check undone and the band off (`BANDS` empty) the same seed reports
nothing."""

from __future__ import annotations

import pytest

from app.adapters import bundle_copy
from tests.sim import link_out
from tests.sim.sweep import run_seeds
from tests.unit.test_simulation_safeguards import Safeguard, safeguard_tests

pytestmark = pytest.mark.unit

FINDS = frozenset({link_out.INVARIANT})


def _every_path_within(mp: pytest.MonkeyPatch) -> None:
    # 90ba4c8 undone: no entry's real path is outside the root, so a link out is copied.
    mp.setattr(bundle_copy, "_within", lambda _root, _real: True)


CASES = [
    Safeguard(
        "a job folder linking out of JOB_ROOT submits nothing from there (90ba4c8)",
        _every_path_within,
        "clean",
        range(189, 190),
        FINDS,
    ),
]


test_the_sweep_finds_the_link_check_undone, test_the_same_seed_is_clean_with_the_check = (
    safeguard_tests(CASES, timeout_s=600)
)


@pytest.mark.parametrize("safeguard", CASES, ids=lambda s: s.name)
def test_without_the_band_the_same_seed_reports_nothing(
    safeguard: Safeguard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It is the band's link that reaches the check: no band, no report."""
    safeguard.switch_off(monkeypatch)
    monkeypatch.setattr(link_out, "BANDS", ())
    seeds = safeguard.seed_list()
    seen = {r.seed: [v.line() for v in r.violations] for r in run_seeds(seeds)}
    assert seen == {seed: [] for seed in seeds}

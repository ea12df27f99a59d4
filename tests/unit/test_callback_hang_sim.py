"""The sweep reaches a640436's "fewest tries first" (round 21's break-it review) through the
`hang` profile (tests/sim/profiles.py), widened in round 21: a hung key (a job, a refused
enqueue) times out or is answered 500, 503, 429 or 408 at once, until the faults stop or,
for half of them, a few seconds only (`app.sim.receiver`: HANG_ANSWERS, HANG_FOR_EVER_P).

- a640436 (`callbacks.due`): after a rest the due events whose last try failed go after
  every other, the fewest tries first (jobs by their cursor's tries, rejected events by
  theirs). Undone (the order of before: tried heads after the others but then by event id,
  rejected events by id alone): two older keys that fail for ever take both tries of every
  rest, and a job whose handler failed once for a few seconds, or a rejected event behind
  one that hangs, is not sent again until the faults stop (`callback-held-back`, which
  checks a key whose hang ended from that end).

Before the widening every hang lasted until the faults stopped, so no job failed once and
then was answered: the old order could starve nothing the checker watched. Hang seeds
0-3000 (FINDINGS.md, round 21): with the order undone, seed 287 reports (the first of some
dozens); with it, none of them, and without the short hangs 287 reports nothing either."""

from __future__ import annotations

import pytest
from sqlalchemy import Select, case

from app.sim import receiver
from app.usecases.callbacks import due as callback_due
from models import CallbackCursor, JobEvent, RejectedRequest
from tests.sim.profiles import PROFILES_BY_NAME
from tests.sim.sweep import run_seeds
from tests.unit.test_simulation_safeguards import Safeguard, safeguard_tests

pytestmark = pytest.mark.unit

FINDS = frozenset({"callback-held-back"})


def _tried_heads_by_id(mp: pytest.MonkeyPatch) -> None:
    # a640436 undone: the jobs whose head was tried after the others, then by event id
    # whatever their tries; rejected events by id alone.
    events: Select = callback_due._DUE_EVENTS  # type: ignore[type-arg]
    rejections: Select = callback_due._DUE_REJECTIONS  # type: ignore[type-arg]
    tried_last = case((CallbackCursor.tries > 0, 1), else_=0)
    mp.setattr(callback_due, "_DUE_EVENTS", events.order_by(None).order_by(tried_last, JobEvent.id))
    mp.setattr(
        callback_due, "_DUE_REJECTIONS", rejections.order_by(None).order_by(RejectedRequest.id)
    )


CASES = [
    Safeguard(
        "after a rest the tries that failed go fewest first (a640436)",
        _tried_heads_by_id,
        "hang",
        range(287, 288),
        FINDS,
        forced=True,
    ),
]


test_the_sweep_finds_the_fewest_tries_first_undone, test_the_same_seeds_are_clean_with_it = (
    safeguard_tests(CASES, timeout_s=600)
)


def test_without_short_hangs_the_same_seeds_report_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It is a job whose hang ended that the old order starves: every hang for ever (the
    profile before round 21's widening, but for how each key fails), no report."""
    _tried_heads_by_id(monkeypatch)
    monkeypatch.setattr(receiver, "HANG_FOR_EVER_P", 1.0)
    seeds = CASES[0].seed_list()
    results = run_seeds(seeds, PROFILES_BY_NAME["hang"])
    seen = {r.seed: [v.line() for v in r.violations] for r in results}
    assert seen == {seed: [] for seed in seeds}

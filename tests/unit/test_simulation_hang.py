"""The sweep's `hang` profile (tests/sim/profiles.py `EXTRA_PROFILES`): flip-api's handler
hangs on some jobs' events only, and every other event must still go out within a
receiver's rest and a sweep (`callback-held-back`, app/sim/receiver.py). Its seeds keep
every promise on the code as it is, and the sweep notices the fix it found switched off
again. (The older fix for a hung job whose history fills a read, 78bba81's second read, is
out of its reach since: hung heads are read last, so such a read holds nothing else due;
test_callback_rounds.py keeps that path.)"""

from __future__ import annotations

import pytest
from sqlalchemy import Select

from app.usecases.callbacks import due as callback_due
from models import JobEvent
from tests.sim.profiles import PROFILES_BY_NAME
from tests.sim.sweep import run_seeds

HANG = PROFILES_BY_NAME["hang"]

# A sweep of many simulations in one test (see test_simulation_safeguards.py).
pytestmark = pytest.mark.timeout(1800)


def test_the_hang_profile_keeps_every_promise() -> None:
    results = list(run_seeds(range(12), HANG))
    found = {r.seed: [v.line() for v in r.violations] for r in results if r.violations}
    assert not found, found


def _oldest_first_whatever_the_head(mp: pytest.MonkeyPatch) -> None:
    # Before the hang profile's finding: due events strictly oldest first, so two hung
    # heads are each other's "one other due event" and the receiver rests while others wait.
    statement: Select = callback_due._DUE_EVENTS  # type: ignore[type-arg]
    mp.setattr(callback_due, "_DUE_EVENTS", statement.order_by(None).order_by(JobEvent.id))


def test_the_sweep_notices_hung_heads_read_before_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _oldest_first_whatever_the_head(monkeypatch)  # worker processes are forked: inherited
    seen: dict[int, set[str]] = {}
    for result in run_seeds(range(12), HANG, fail_fast=True):
        seen[result.seed] = {v.invariant for v in result.violations}
        if "callback-held-back" in seen[result.seed]:
            return
    pytest.fail(f"no hang seed in 0-11 reports callback-held-back with the order reverted: {seen}")

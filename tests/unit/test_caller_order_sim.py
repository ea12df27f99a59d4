"""The sweep reaches round 16's three defects found outside it (tests/sim/FINDINGS.md, "Round
16: reach of the reviews' defects"), each through a band of its own stream:

- A (4a86380): an abort handled while its job's enqueue waits out a database retry was
  answered "not found" and lost; the job ran (`tests.sim.early_abort`, `abort-honoured`).
- B (ef0a537): a re-sent submit (first reply lost, the run landed) that finds its bundle gone
  failed the job with no stray; the next job ran beside the landed run
  (`tests.sim.gone_bundle`, `claim-beside-live-run`).
- C (880573c): a definition whose lookup the file system refuses (a name past 255 bytes)
  failed the enqueue task for good, unrecorded (`tests.sim.unnameable`, `request-lost`).

With each fix undone a seed of a small range reports; the same seeds are clean with it."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

import pytest

from app.errors import InvalidRequest
from app.settings import Settings
from app.usecases import early_aborts, enqueue, refused_definitions
from tests.unit.test_simulation_safeguards import (
    Safeguard,
    safeguard_tests,
)

pytestmark = pytest.mark.unit


def _abort_not_kept(mp: pytest.MonkeyPatch) -> None:
    # A, before 4a86380: nothing kept the abort of a job not stored yet (answered as kept
    # here, so only the job's end can tell).
    def keep(_session: Any, _job: Any, _reason: str, _code: Any, **kw: Any) -> datetime:
        now: datetime = kw["now"]
        return now + timedelta(seconds=kw["retention_s"])

    mp.setattr(early_aborts, "keep", keep)


def _no_stray_for_a_gone_bundle(mp: pytest.MonkeyPatch) -> None:
    # B, before ef0a537: the job failed for its bundle kept no stray for its token.
    real = refused_definitions.fail_job

    def old(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **{**kwargs, "may_have_sent": False})

    mp.setattr(refused_definitions, "fail_job", old)


def _lookup_unguarded(mp: pytest.MonkeyPatch) -> None:
    # C, resolve_definition before 880573c: the lookup's OSError left the use case.
    real = enqueue.resolve_definition

    def old(settings: Settings, definition: str) -> str:
        if not definition.startswith("s3://") and not PurePosixPath(definition).is_absolute():
            folder = (settings.job_root.resolve() / definition).resolve()
            if folder.is_relative_to(settings.job_root.resolve()) and not folder.is_dir():
                raise InvalidRequest(f"definition {definition!r} is not a folder")
        return real(settings, definition)

    mp.setattr(enqueue, "resolve_definition", old)


CALLER_ORDERS = [
    Safeguard(
        "an abort handled before its job's enqueue is stored is kept (4a86380)",
        _abort_not_kept,
        "chaos",
        # tests.sim.early_abort: chaos 98 and 116 (8 of the 9 band worlds of 0-200 with the
        # fix undone; in 152 the retried enqueue ran before the abort).
        range(95, 120),
        frozenset({"abort-honoured"}),
    ),
    Safeguard(
        "a submit retried onto a gone bundle keeps its landed run as a stray (ef0a537)",
        _no_stray_for_a_gone_bundle,
        "ops",
        # tests.sim.gone_bundle: ops 86 and 104 (23 of the 41 band worlds of 0-600).
        range(85, 105),
        frozenset({"claim-beside-live-run", "one-run-per-server", "unaccounted-run"}),
    ),
    Safeguard(
        "a definition past NAME_MAX is refused and recorded (880573c)",
        _lookup_unguarded,
        "clean",
        # tests.sim.unnameable: clean 225 and 252 (every band world of 0-200 with it undone).
        range(225, 253),
        frozenset({"request-lost", "no-escape"}),
    ),
]


# The sweep finds each fix undone; the same seeds are clean with it.
test_the_sweep_finds_a_round_16_fix_undone, test_the_same_seeds_are_clean_with_the_fix = (
    safeguard_tests(CALLER_ORDERS, timeout_s=900)
)

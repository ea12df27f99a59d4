"""The sweep reaches round 22's refusal fixes through `tests.sim.refusal_race`'s band worlds
(draws of the refusal-repeat band after all of its earlier ones; `one-refusal-per-request`):

- d2c2629: a refused enqueue's record reads the job its key names first and answers with it
  when it is the same request (`intake._accepted_as`). Undone (it never does): RACE, at the
  refused message's record a copy of it (the same task id) runs on the other worker once
  the definition's folder shows up and creates the job; the first copy then records its
  refusal and a `rejected` event (clean 900).
- 98f9d8b: a task id flip-api names itself, longer than 255 characters or holding a NUL or
  a lone surrogate, is recorded as its head and SHA-256 (`enqueue.recordable_message_id`).
  Undone (None for such an id, as before): ODD, the refused message's duplicate, judged
  again once the folder shows up, creates the job (clean 900, a NUL; servers 679, longer
  than 255; misconfig 574, a lone surrogate).

With each fix undone its seed reports; the same seeds are clean with it (tests/sim/FINDINGS.md,
"Round 22 (refusals)": the figures over a seed range)."""

from __future__ import annotations

from typing import Any

import pytest

from app.schemas import unstorable
from app.usecases import enqueue, intake
from tests.unit.test_simulation_safeguards import Safeguard, safeguard_tests

pytestmark = pytest.mark.unit

FINDS = frozenset({"one-refusal-per-request"})


def _record_never_reads_the_job(mp: pytest.MonkeyPatch) -> None:
    # d2c2629 undone: the refusal's record never answers with the job a copy created.
    mp.setattr(intake, "_accepted_as", lambda *_args, **_kw: None)


def _odd_task_ids_unrecorded(mp: pytest.MonkeyPatch) -> None:
    # 98f9d8b undone: an id too long for its column, or one the database cannot store, is
    # not recorded (a copy of its message is matched by key only).
    def before(message_id: str | None) -> Any:
        if not message_id or len(message_id) > enqueue.MESSAGE_ID_MAX_CHARS:
            return None
        return None if unstorable(message_id) else message_id

    mp.setattr(enqueue, "recordable_message_id", before)


RACES = [
    Safeguard(
        "a copy accepted while the first records its refusal is the answer (d2c2629)",
        _record_never_reads_the_job,
        "clean",
        range(900, 901),
        FINDS,
    ),
    Safeguard(
        "a copy of a refused message whose task id holds a NUL stays refused (98f9d8b)",
        _odd_task_ids_unrecorded,
        "clean",
        range(900, 901),
        FINDS,
    ),
    Safeguard(
        "a copy of a refused message whose task id is too long stays refused (98f9d8b)",
        _odd_task_ids_unrecorded,
        "servers",
        range(679, 680),
        FINDS,
    ),
    Safeguard(
        "a copy of a refused message whose task id holds a surrogate stays refused (98f9d8b)",
        _odd_task_ids_unrecorded,
        "misconfig",
        range(574, 575),
        FINDS,
    ),
]


test_the_sweep_finds_a_refusal_race_fix_undone, test_the_same_seeds_are_clean_with_the_fix = (
    safeguard_tests(RACES, timeout_s=600)
)

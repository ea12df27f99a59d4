"""test_faults' watch of a re-drive (`lease_taken_over`) must tell a re-drive from a step of
the chain that survived the worker kill.

The kill can land while the poll's next message (a wait_ready countdown, published by the
pool child before its ack) is still in Redis, not yet reserved by the worker's two prefetch
slots (beat's monitor, assign and scale-down rounds, each once a second, hold them too). The
restarted worker then runs that poll, which renews the job's step lease: `step_due_at`
changes seconds after the kill, long before the killed poll's lease lapsed, with no re-drive
at all. A re-drive can only take the job over once that lease has passed
(`step_leases._take_over` checks `lapsed`), so a change seen before it is not one; the watch
takes it for one, and the re-drive bound the test names is then checked against nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from app.local.stack import LocalStack
from models import JobState
from tests.e2e.test_faults import lease_taken_over

pytestmark = pytest.mark.unit


@dataclass
class _Row:
    state: JobState
    step_due_at: datetime


@dataclass
class _Stack:
    """The two reads lease_taken_over makes of a stack: the job's row, polled."""

    rows: list[_Row]
    processes: dict[str, Any] = field(default_factory=dict)
    workdir: Path = Path(".")
    wait_for = LocalStack.wait_for

    def job(self, _job_id: uuid.UUID) -> _Row:
        return self.rows.pop(0) if len(self.rows) > 1 else self.rows[0]


def _rows(held: datetime, moved_to: datetime) -> list[_Row]:
    return [_Row(JobState.ASSIGNED, held)] * 3 + [_Row(JobState.ASSIGNED, moved_to)]


def test_a_lease_renewed_before_it_lapsed_is_not_taken_for_a_re_drive():
    now = datetime.now(UTC)
    held = now + timedelta(seconds=30)  # the killed poll's lease: 30 s left
    stack = _Stack(_rows(held, now + timedelta(seconds=31)))  # the next poll's, at once
    with pytest.raises(AssertionError):
        lease_taken_over(stack, uuid.uuid4())  # type: ignore[arg-type]


def test_a_take_over_after_the_lease_lapsed_is_a_re_drive():
    now = datetime.now(UTC)
    held = now - timedelta(seconds=1)  # lapsed: a round may take the job over
    stack = _Stack(_rows(held, now + timedelta(seconds=30)))
    assert lease_taken_over(stack, uuid.uuid4()) >= now  # type: ignore[arg-type]

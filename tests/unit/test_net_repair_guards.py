"""reconcile's net repairs say nothing of a net with nothing to repair."""

from __future__ import annotations

from app.usecases import reconciler
from models import NetState


def _notes(world) -> list[str]:
    return list(reconciler.reconcile(world.rt).repaired)


def test_a_stopped_net_with_no_stray_runs_has_none_to_clear(world):
    """A STOPPED net at zero replicas without stray runs gets no 'stray runs gone' repair."""
    assert world.net("net-a").state == NetState.STOPPED
    assert [n for n in _notes(world) if n.startswith("net-a")] == []


def test_an_outage_already_noted_adds_no_note(always_on):
    """An always-on server still unreachable on the next round is no new repair."""
    always_on.server("fixed").up = False
    assert [n for n in _notes(always_on) if n.startswith("fixed")] == ["fixed: STOPPED -> OUTAGE"]
    assert [n for n in _notes(always_on) if n.startswith("fixed")] == []

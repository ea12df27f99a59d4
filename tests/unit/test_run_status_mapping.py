"""NVFLARE's run statuses in the dispatcher's words: an unknown FINISHED:* is a run that
ended without a verdict (LOST), any other unknown status a run still going, and the detail
names NVFLARE's own status for the history."""

from __future__ import annotations

import pytest

from app.adapters.nvflare.base import RunState
from app.adapters.nvflare.classify import run_status


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("FINISHED:COMPLETED", RunState.COMPLETED),
        ("FINISHED:SOMETHING_NEWER", RunState.LOST),
        ("SUBMITTED", RunState.RUNNING),
        ("DISPATCHED", RunState.RUNNING),
        ("SOMETHING_NEWER", RunState.RUNNING),
    ],
)
def test_a_status_maps_to_a_run_state_and_names_itself(raw, state):
    status = run_status(raw)
    assert (status.state, status.detail) == (state, f"NVFLARE {raw}")

"""NVFLARE's run statuses in the dispatcher's words: an unknown FINISHED:* is a run that
ended without a verdict (LOST), any other unknown status a run still going, and the detail
names NVFLARE's own status for the history."""

from __future__ import annotations

import pytest

from app.adapters.nvflare.base import RunState
from app.adapters.nvflare.classify import aborted_before_start, meta_status, run_status


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


@pytest.mark.parametrize(
    ("meta", "unstarted"),
    [
        ({"status": "FINISHED:ABORTED"}, True),  # aborted before the runner started it
        ({"status": "FINISHED:ABORTED", "start_time": ""}, True),
        ({"status": "FINISHED:ABORTED", "start_time": "2026-12-02T10:00:00+00:00"}, False),
        ({"status": "FINISHED:COMPLETED"}, False),
        ({"status": "SUBMITTED"}, False),
    ],
)
def test_an_abort_before_the_run_started_reads_unstarted(meta, unstarted):
    status = meta_status(meta)
    assert status is not None and status.unstarted is unstarted


@pytest.mark.parametrize(
    ("status", "message", "before"),
    [
        ("SUBMITTED", "", True),
        ("DISPATCHED", "Abort signal has been sent to the server app.", True),
        ("", "Aborted the job 7 before running it.", True),  # the status read failed
        ("RUNNING", "Abort signal has been sent to the server app.", False),
        ("", None, False),
    ],
)
def test_an_abort_answered_before_start(status, message, before):
    assert aborted_before_start(status, message) is before

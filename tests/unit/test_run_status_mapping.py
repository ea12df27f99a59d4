"""NVFLARE's run statuses in the dispatcher's words: an unknown FINISHED:* is a run that
ended without a verdict (LOST), any other unknown status a run still going, and the detail
names NVFLARE's own status for the history."""

from __future__ import annotations

import time

import pytest

from app.adapters.backend import RunState
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


@pytest.mark.parametrize(
    ("meta", "state", "started_at"),
    [
        # The job store's start_time, in UTC whether or not it says so, for a RUNNING run...
        ({"status": "RUNNING", "start_time": "1970-01-01T00:01:40+00:00"}, RunState.RUNNING, 100),
        ({"status": "RUNNING", "start_time": "1970-01-01T00:01:40"}, RunState.RUNNING, 100),
        ({"status": "RUNNING", "start_time": "not a time"}, RunState.RUNNING, None),
        # ...and for no other.
        (
            {"status": "FINISHED:COMPLETED", "start_time": "1970-01-01T00:01:40"},
            RunState.COMPLETED,
            None,
        ),
    ],
)
def test_a_runs_meta_gives_its_state_and_when_it_went_running(meta, state, started_at):
    status = meta_status(meta)
    assert status is not None
    assert (status.state, status.started_at) == (state, started_at)


def test_a_start_time_without_a_zone_is_utc_whatever_the_hosts_zone(monkeypatch):
    """nvflare writes UTC; a worker whose host runs in another zone must not shift it."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        status = meta_status({"status": "RUNNING", "start_time": "1970-01-01T00:01:40"})
    finally:
        monkeypatch.undo()
        time.tzset()
    assert status is not None and status.started_at == 100

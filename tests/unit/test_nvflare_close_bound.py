"""Closing an nvflare session never holds its caller for long.

nvflare's close stops the session's cell, which joins its executor threads; under load that
join was seen to hang for the whole 600 s test timeout (tests/integration/test_nvflare_admin.py
on a machine at load 14), holding a worker's slot, and a readiness poll's chain with it. The
hang itself cannot be produced on demand, so the bound is checked here on a session whose
close blocks until released; what nvflare's close does is the integration tier's.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from app.adapters.nvflare import sessions as nvflare_sessions

pytestmark = pytest.mark.unit


class _StuckApi:
    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.closed = False

    def close(self) -> None:
        self.release.wait()
        self.closed = True


class _StuckSession:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.api = _StuckApi(self.release)
        self.logged_out = False

    def close(self) -> None:
        self.release.wait()
        self.logged_out = True


@pytest.mark.parametrize("logout", [False, True], ids=["close", "logout"])
def test_a_close_that_hangs_returns_to_its_caller_within_the_bound(
    monkeypatch: pytest.MonkeyPatch, logout: bool
) -> None:
    monkeypatch.setattr(nvflare_sessions, "CLOSE_WAIT_S", 0.3)
    session: Any = _StuckSession()
    # Released after 8 s whatever happens, so a close that blocks its caller fails the test
    # instead of hanging it.
    threading.Timer(8.0, session.release.set).start()
    started = time.monotonic()
    nvflare_sessions.close_quietly(session, logout=logout)
    took = time.monotonic() - started
    assert took < 5.0, f"the caller waited {took:.1f} s for a close that hangs"
    session.release.set()
    # The close still finishes in the background once nvflare lets it.
    deadline = time.monotonic() + 5
    while not (session.logged_out if logout else session.api.closed):
        assert time.monotonic() < deadline, "the background close never finished"
        time.sleep(0.01)


def test_a_close_that_finishes_in_time_is_waited_for() -> None:
    session: Any = _StuckSession()
    session.release.set()
    nvflare_sessions.close_quietly(session, logout=False)
    assert session.api.closed  # done before the call returned, not left to a thread

"""StaticDriver: always on, and scale requests are recorded but change nothing."""

from __future__ import annotations

import logging

import pytest

from app.adapters.drivers.base import Observation
from app.adapters.drivers.static import StaticDriver


def test_observe_reports_one_running_replica() -> None:
    observed = StaticDriver().observe()

    assert observed == Observation(desired=1, running=1, pending=0, failure=None)
    assert observed.is_up
    assert StaticDriver.kind == "static"


def test_scale_is_recorded_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    driver = StaticDriver("net-1")

    with caplog.at_level(logging.INFO, logger="app.adapters.drivers.static"):
        driver.scale(0)
        driver.scale(1)
        driver.scale(0)

    assert driver.requested == [0, 1, 0]
    assert driver.observe() == Observation(desired=1, running=1, pending=0)
    assert len(caplog.records) == 3
    assert "net-1" in caplog.records[0].getMessage()
    assert "always on" in caplog.records[0].getMessage()

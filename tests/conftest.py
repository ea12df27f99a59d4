"""Fixtures shared by every tier; each tier's real services live in tests/fixtures/."""

import pytest

pytest_plugins = [
    "tests.fixtures.testrun",  # first: what a killed run left is cleared before anything starts
    "tests.fixtures.db",
    "tests.fixtures.nvflare",
    "tests.fixtures.flower",
    "tests.fixtures.aws",
    "tests.fixtures.containers",
]


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile` as tests/tools/schedule.py shares it out: the slow modules (those
    with an `EXPECTED_S`, the seconds they take on the 2-core CI machine) first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.tools.schedule import SlowFirstScheduling

    return SlowFirstScheduling(config, log)


@pytest.fixture(autouse=True)
def _start_check_forgotten() -> object:
    """A test that runs a worker start in this process (`prepare_nets_at_start`) leaves what
    it found (`net_check.record_start_check`, per process) to no other test."""
    from app.adapters import net_check

    yield
    net_check.record_start_check({})

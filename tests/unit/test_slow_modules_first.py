"""How the test command shares modules out among workers (tests/tools/schedule.py): the slow
modules first, and nothing long queued behind a worker's slow module."""

from __future__ import annotations

from pathlib import Path

from tests.tools.schedule import expected_s, next_module

ROOT = Path(__file__).resolve().parents[2]
QUEUE = [
    ("tests/integration/test_api.py", 40),
    ("tests/e2e/test_sim.py", 1),
    ("tests/integration/test_tiny.py", 2),
    ("tests/e2e/test_faults.py", 6),
    ("tests/integration/test_small.py", 5),
]
WEIGHT = {
    "tests/integration/test_api.py": 0.0,
    "tests/e2e/test_sim.py": 185.0,
    "tests/integration/test_tiny.py": 0.0,
    "tests/e2e/test_faults.py": 240.0,
    "tests/integration/test_small.py": 0.0,
}


def test_a_free_worker_gets_the_slowest_module_left() -> None:
    assert next_module(QUEUE, WEIGHT, busy=False) == "tests/e2e/test_faults.py"
    rest = [entry for entry in QUEUE if entry[0] != "tests/e2e/test_faults.py"]
    assert next_module(rest, WEIGHT, busy=False) == "tests/e2e/test_sim.py"


def test_a_worker_busy_with_a_slow_module_gets_the_shortest_left() -> None:
    """Its next module runs after the slow one: a short one, not another slow one."""
    assert next_module(QUEUE, WEIGHT, busy=True) == "tests/integration/test_tiny.py"


def test_the_declared_time_is_read_from_the_module_text() -> None:
    """The controller never imports test modules: EXPECTED_S is read from the file."""
    assert expected_s(ROOT, "tests/e2e/test_faults.py") >= 150
    assert expected_s(ROOT, "tests/e2e/test_lost_server.py") >= 150
    assert expected_s(ROOT, "tests/e2e/test_simulate_vs_real.py") >= 100
    assert expected_s(ROOT, "tests/integration/test_migrations.py") == 0.0
    assert expected_s(ROOT, "tests/no/such/module.py") == 0.0

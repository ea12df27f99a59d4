"""`-m unit`, `-m integration`, `-m e2e` and `-m containers` select exactly their folders
(tests/run.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e", "containers")


def test_every_collected_test_carries_exactly_its_folders_tier_marker(request):
    # Whatever this run collected: everything in a full run, only the unit tier under -m unit
    # (so an integration or e2e test marked `unit` would show up here).
    items = request.session.items
    assert request.node in items
    wrong = []
    for item in items:
        folder = item.path.resolve().relative_to(TESTS).parts[0]
        tiers = {t for t in TIERS if item.get_closest_marker(t) is not None}
        if tiers != {folder}:
            wrong.append(f"{item.nodeid}: {sorted(tiers)}")
    assert not wrong, "\n".join(wrong)


def test_the_unit_marker_is_registered():
    import tomllib

    markers = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"
    ]["markers"]
    assert {m.split(":", 1)[0] for m in markers} >= set(TIERS)


@pytest.mark.parametrize("tier", TIERS)
def test_each_tier_folder_exists(tier):
    assert (TESTS / tier).is_dir()


def test_the_closing_report_counts_every_tier_and_names_the_slowest(tmp_path):
    from tests.tools import test_report

    junit = tmp_path / "unit.xml"
    junit.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.unit.test_a" name="test_ok" time="0.5"/>'
        '<testcase classname="tests.unit.test_a" name="test_bad" time="2.0">'
        '<failure message="x"/></testcase>'
        '<testcase classname="tests.e2e.test_b" name="test_slow" time="30.0"/>'
        '<testcase classname="tests.e2e.test_b" name="test_skip" time="0">'
        '<skipped message="y"/></testcase>'
        "</testsuite></testsuites>"
    )
    text = test_report.report(test_report.read(junit))
    lines = text.splitlines()
    assert "         e2e:     2 tests,    30.0 s" in lines
    assert "        unit:     2 tests,     2.5 s" in lines
    assert lines.index("    30.0 s  tests/e2e/test_b.py::test_slow") < lines.index(
        "     2.0 s  tests/unit/test_a.py::test_bad"
    )
    assert lines[-1] == "total: 2 passed, 1 failed, 1 skipped"

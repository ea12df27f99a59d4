"""The mutation report's arithmetic: which of mutmut's exit codes count as killed (mypy's
rejections among them, counted apart), survived, without tests or not checked, and the score."""

from __future__ import annotations

import json

from tests.mutation import report


def test_the_report_counts_mypys_rejections_as_killed_and_says_how_many(tmp_path, monkeypatch):
    meta = tmp_path / "mutants" / "app" / "core.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {"m1": 1, "m2": 37, "m3": 37, "m4": 0, "m5": 33, "m6": None}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    monkeypatch.setattr(report, "ROOT", tmp_path)

    result = report.read_results("app/core.py")

    assert (result.killed, result.by_mypy) == (3, 2)
    assert (result.survived, result.no_tests) == (["m4"], ["m5"])
    assert result.other == {"not checked": 1}
    assert result.score == 60.0
    table = report.render([result], with_diffs=False)
    assert "| `app/core.py` | 6 | 3 | 2 | 1 | 1 | 1 | 60.0% |" in table
    assert "| **total** | 6 | 3 | 2 | 1 | 1 | 1 | 60.0% |" in table

"""The alert rules and the dashboard shipped in app/monitoring: `promtool test rules` drives
every rule firing and not firing on synthetic series, and every query they make names a
metric the service exports."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.metrics.exposition import families
from app.metrics.figures import Histogram, Snapshot
from models import JobState, NetState

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "app" / "monitoring" / "alerts.yml"
DASHBOARD = ROOT / "app" / "monitoring" / "dashboard.json"
RULE_TESTS = Path(__file__).resolve().parent / "promtool" / "alerts_test.yml"

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
_KEYWORDS |= {"unless", "bool", "offset", "inf", "nan"}


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    # Debian's prometheus package; tests/run.sh installs it where it is missing.
    command = ["promtool", *map(str, args)]
    return subprocess.run(command, check=False, capture_output=True, text=True)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label
    matchers, ranges, grouping clauses, functions and keywords are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\$\w+", " ", expr)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        followed = expr[match.end() :].lstrip()
        if match.group() not in _KEYWORDS and not followed.startswith("("):
            names.add(match.group())
    return names


def exported() -> set[str]:
    """Every sample name /metrics can expose (a snapshot with a value in every family)."""
    snap = Snapshot(
        jobs_by_state={JobState.QUEUED: 1},
        net_states={"net-a": NetState.READY},
        queue_wait=Histogram.of([1.0], (1, 5)),
        scale_events={("net-a", "scale_up", "ok"): 1},
        uptime_s={"net-a": 1.0},
        stray_runs={"net-a": 1},
        idle_s={"net-a": 1.0},
        idle_grace_s={"net-a": 600.0},
        housekeeping_last_run={"reconcile": datetime(2026, 1, 1, tzinfo=UTC).timestamp()},
    )

    class Fixed:
        def collect(self):
            return families(snap)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    text = generate_latest(registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_promtool_runs_the_rule_tests_and_they_pass():
    checked = promtool("check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_rule_is_tested_firing_and_not_firing():
    cases: dict[str, set[bool]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case["exp_alerts"]))
    names = {r["alert"] for r in rules()}
    assert len(names) == len(rules()) == 9  # one per condition of README "What to page on"
    assert cases == {name: {True, False} for name in names}


def test_every_rule_and_dashboard_query_names_exported_metrics():
    metrics = exported()
    queries = [r["expr"] for r in rules()] + dashboard_queries()
    assert len(queries) > 20
    for query in queries:
        named = metric_names(query)
        assert named, query
        assert named <= metrics, (query, named - metrics)
    # Between them they read every family the service exports, bar none.
    used = set().union(*(metric_names(q) for q in queries))
    families_used = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert {re.sub(r"_(bucket|sum|count)$", "", n) for n in metrics} == families_used


def test_the_name_check_sees_a_name_that_is_not_exported():
    query = 'max by (net) (fl_dispatcher_nets{state="READY"}) - on (net) rate(fl_dispatcher_x[5m])'
    assert metric_names(query) == {"fl_dispatcher_nets", "fl_dispatcher_x"}
    assert "fl_dispatcher_x" not in exported()


def test_every_dashboard_query_is_valid_promql(tmp_path):
    # promtool parses a rules file's expressions: each query as a recording rule.
    records = [{"record": f"dashboard:q{i}", "expr": q} for i, q in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    checked = promtool("check", "rules", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr

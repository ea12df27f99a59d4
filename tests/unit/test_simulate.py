"""`fl-dispatcher simulate`: the trace format and its validator, the synthetic generator,
the report's maths, a replay's figures on traces small enough to reason about, the fast
clock against the step-by-step one, and the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from app.entrypoints.cli import main
from app.sim import savings, savings_args
from app.sim.savings import GraceResult, percentile, recommend, replay
from app.sim.simulation import Simulation
from app.sim.trace import (
    FLIP_UTILIZATION,
    Synthetic,
    Trace,
    TraceError,
    TraceJob,
    format_trace,
    parse_trace,
    synthesize,
)
from app.sim.workload import ColdStart
from tests.sim.invariants import Checker

COLD = ColdStart("test", provision_s=2.0, login_s=3.0, sites_s=5.0, stop_s=0.0)  # 10 s


# --- the trace format ----------------------------------------------------------------------


def test_a_csv_trace_is_read_in_submission_order_with_its_defaults():
    text = (
        "# a comment\n"
        "submitted_at,duration_s,net,required_sites,priority\n"
        "60,30.5,net-b,site-1;site-3,5\n"
        "\n"
        "0,120,,,\n"
    )
    trace = parse_trace(text, "t.csv")
    assert trace.jobs == (
        TraceJob(0.0, 120.0, None, ("site-1", "site-2"), 0, line=5),
        TraceJob(60.0, 30.5, "net-b", ("site-1", "site-3"), 5, line=3),
    )
    assert trace.horizon_s == 120.0
    assert trace.nets_named() == ["net-b"]
    assert trace.sites() == ("site-1", "site-2", "site-3")


def test_a_json_lines_trace_reads_the_same_as_its_csv():
    trace = synthesize(Synthetic(seed=3, days=0.5))
    as_csv = parse_trace(format_trace(trace), "t.csv")
    as_json = parse_trace(format_trace(trace, jsonl=True), "t.jsonl")
    strip = [
        (j.submitted_at, j.duration_s, j.net, j.required_sites, j.priority) for j in trace.jobs
    ]
    assert [
        (j.submitted_at, j.duration_s, j.net, j.required_sites, j.priority) for j in as_csv.jobs
    ] == strip
    assert [
        (j.submitted_at, j.duration_s, j.net, j.required_sites, j.priority) for j in as_json.jobs
    ] == strip


def test_iso_timestamps_count_from_the_first_submission():
    text = (
        '{"submitted_at": "2026-03-01T10:05:00Z", "duration_s": 60}\n'
        '{"submitted_at": "2026-03-01T10:00:00+00:00", "duration_s": 60, "net": null,'
        ' "required_sites": ["a"], "priority": 1}\n'
    )
    trace = parse_trace(text, "t.jsonl")
    assert [(j.submitted_at, j.line) for j in trace.jobs] == [(0.0, 2), (300.0, 1)]
    assert trace.jobs[0].required_sites == ("a",) and trace.jobs[0].priority == 1


def test_the_validator_names_every_bad_line_and_what_is_wrong():
    text = (
        "submitted_at,duration_s,net,required_sites,priority\n"
        "0,60,,,\n"
        "5,abc,,,\n"
        "-3,0,,,\n"
        "7,10,,,high\n"
        "8,10\n"
        "yesterday,10,,,\n"
    )
    with pytest.raises(TraceError) as caught:
        parse_trace(text, "w.csv")
    assert caught.value.problems == [
        "w.csv:3: duration_s: 'abc' is not a number",
        "w.csv:4: submitted_at: -3 must be seconds >= 0",
        "w.csv:4: duration_s: 0 must be > 0",
        "w.csv:5: priority: 'high' is not an integer",
        "w.csv:6: 2 fields, the header has 5",
        "w.csv:7: submitted_at: 'yesterday' is neither seconds nor an ISO 8601 time",
    ]


def test_the_validator_checks_json_lines_too():
    text = (
        '{"submitted_at": 0, "duration_s": 10}\n'
        "\n"
        '{"submitted_at": 1, "duration_s": 10, "site": ["x"]}\n'
        "[1, 2]\n"
        '{"submitted_at": 2, "duration_s": 10, "required_sites": []}\n'
        '{"submitted_at": 3, "duration_s": 10, "net": 7}\n'
        '{"submitted_at": "2026-03-01T10:00:00", "duration_s": 10}\n'
        '{"submitted_at": 4, "duration_s": 10,\n'
    )
    with pytest.raises(TraceError) as caught:
        parse_trace(text, "w.jsonl")
    problems = caught.value.problems
    assert problems[0].startswith("w.jsonl:3: unknown field 'site'")
    assert problems[1:5] == [
        "w.jsonl:4: not a JSON object",
        "w.jsonl:5: required_sites: empty (name at least one site, or leave it out)",
        "w.jsonl:6: net: 7 must be a net's name or null",
        "w.jsonl:7: submitted_at: '2026-03-01T10:00:00' has no time zone (add Z or +00:00)",
    ]
    assert problems[5].startswith("w.jsonl:8: not valid JSON")
    assert len(problems) == 6


def test_a_header_without_the_required_columns_is_refused():
    with pytest.raises(TraceError) as caught:
        parse_trace("when,duration_s\n0,10\n", "h.csv")
    assert caught.value.problems == [
        "h.csv:1: header: missing column(s) submitted_at; unknown column(s) when (columns:"
        " submitted_at, duration_s, net, required_sites, priority, hint_lead_s)"
    ]


def test_mixing_seconds_and_timestamps_is_refused():
    text = (
        '{"submitted_at": 0, "duration_s": 10}\n'
        '{"submitted_at": "2026-03-01T10:00:00Z", "duration_s": 10}\n'
    )
    with pytest.raises(TraceError, match=r"m.jsonl:2: submitted_at: a timestamp while"):
        parse_trace(text, "m.jsonl")


def test_an_empty_trace_is_refused():
    with pytest.raises(TraceError, match="no jobs"):
        parse_trace("submitted_at,duration_s\n", "e.csv")


def test_a_job_naming_a_net_the_simulation_lacks_is_named():
    trace = parse_trace("submitted_at,duration_s,net\n0,10,net-a\n5,10,net-z\n", "n.csv")
    with pytest.raises(TraceError) as caught:
        savings_args.parse_nets("net-a,net-b", trace)
    assert caught.value.problems == [
        "n.csv:3: net 'net-z' is not one of the simulated nets (net-a, net-b)"
    ]
    assert savings_args.parse_nets(None, trace) == ("net-a", "net-z")
    assert savings_args.parse_nets("3", parse_trace("submitted_at,duration_s\n0,1\n")) == (
        "net-1",
        "net-2",
        "net-3",
    )


# --- the synthetic trace ---------------------------------------------------------------------


def test_a_synthetic_trace_is_reproducible_from_its_seed():
    assert synthesize(Synthetic(seed=7, days=3)) == synthesize(Synthetic(seed=7, days=3))
    assert synthesize(Synthetic(seed=7, days=3)).jobs != synthesize(Synthetic(seed=8, days=3)).jobs


@pytest.mark.parametrize("utilization", [FLIP_UTILIZATION, 0.5])
def test_the_default_synthetic_month_is_shaped_like_flips_load(utilization):
    spec = Synthetic(seed=1, utilization=utilization)
    trace = synthesize(spec)
    assert trace.horizon_s <= spec.days * 86400
    assert trace.utilization(spec.nets) == pytest.approx(utilization, rel=0.02)
    assert 800 <= len(trace.jobs) <= 1300  # FLIP's scale: about 1,000 jobs a month
    long_jobs = [j for j in trace.jobs if j.duration_s >= 3600]
    assert 1 <= len(long_jobs) / spec.days <= 6  # a few multi-hour jobs a day
    gaps = [
        b.submitted_at - a.submitted_at for a, b in zip(trace.jobs, trace.jobs[1:], strict=False)
    ]
    assert sum(g < 300 for g in gaps) > len(gaps) / 2  # most jobs come in bursts


def test_synthetic_settings_no_trace_can_have_are_refused():
    with pytest.raises(ValueError, match="utilization"):
        synthesize(Synthetic(utilization=1.5))


# --- the report's maths ----------------------------------------------------------------------


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 100) == 100.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([], 95) == 0.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def _result(grace: float, server_h: float, p95: float) -> GraceResult:
    return GraceResult(grace, server_h, 0.0, 0.0, 0, 0.0, p95, p95, 0, 0, 0.0)


def test_the_recommended_grace_is_the_cheapest_within_the_budget():
    results = [
        _result(0, 10.0, 40.0),  # cheapest, but waits too long
        _result(60, 12.0, 9.0),
        _result(300, 12.0, 2.0),  # as cheap as 60 s: the shorter grace wins the tie
        _result(600, 15.0, 0.0),
    ]
    assert recommend(results, budget_s=10.0) == 60
    assert recommend(results, budget_s=50.0) == 0
    assert recommend(results, budget_s=1.0) == 600
    assert recommend(results[:1], budget_s=1.0) is None


def test_server_time_is_the_time_with_a_replica():
    timeline = [(10.0, 1), (50.0, 0), (100.0, 1), (130.0, 0), (200.0, 1)]
    assert savings._up_seconds(timeline, end=260.0) == 40 + 30 + 60
    assert savings._up_seconds([], end=10.0) == 0.0


def test_grace_and_cold_start_options_parse():
    assert savings_args.parse_graces("300,0,60,60") == (0.0, 60.0, 300.0)
    for bad in ("", "a", "-5", "inf"):
        with pytest.raises(ValueError):
            savings_args.parse_graces(bad)
    assert savings_args.parse_cold_start("fargate") is savings.FARGATE
    assert savings_args.parse_cold_start("1,2,3").total_s == 6.0
    with pytest.raises(ValueError):
        savings_args.parse_cold_start("1,2")


# --- replays ---------------------------------------------------------------------------------


def _trace(*jobs: tuple[float, float]) -> Trace:
    return Trace(tuple(TraceJob(at, duration) for at, duration in jobs))


def test_one_job_on_a_cold_net_waits_one_cold_start_and_pays_for_its_grace():
    trace = _trace((100.0, 200.0))
    warm = replay(trace, ["net-1"], None, COLD)
    cold = replay(trace, ["net-1"], 60.0, COLD)
    assert warm.cold_starts == 0 and cold.cold_starts == 1 and cold.cold_waits == 1
    added = cold.waits[0] - warm.waits[0]
    # The cold start, plus at most one readiness poll (READY_POLL_S, 1 s) and the steps.
    assert COLD.total_s <= added <= COLD.total_s + 2.0
    # Up from the scale-up to the first idle tick past the grace (HOUSEKEEPING_INTERVAL_S 15).
    up = cold.up_s
    assert COLD.total_s + 200 + 60 <= up <= COLD.total_s + 200 + 60 + 15 + 3
    assert cold.unfinished == warm.unfinished == 0


def test_a_job_inside_the_grace_finds_the_server_warm():
    trace = _trace((0.0, 60.0), (150.0, 60.0), (2000.0, 60.0))
    run = replay(trace, ["net-1"], 300.0, COLD)
    # The second job comes 90 s after the first ended (inside the grace); the third after.
    assert run.cold_starts == 2 and run.cold_waits == 2
    short = replay(trace, ["net-1"], 30.0, COLD)
    assert short.cold_starts == 3 and short.up_s < run.up_s


def test_the_fast_clock_changes_no_figure():
    """Skipping beat ticks and polls that would do nothing gives the figures of stepping
    through every one of them (within the steps' sub-second jitter)."""
    trace = _trace((0.0, 300.0), (20.0, 100.0), (30.0, 50.0), (900.0, 120.0), (1000.0, 30.0))
    nets = ("net-1", "net-2")
    world = savings.world_for(trace, nets, 60.0, COLD)
    workload = savings.workload_for(trace)
    figures = []
    for fast in (False, True):
        sim = Simulation(
            world,
            workload,
            savings.CLEAN,
            0,
            checker=None if fast else Checker(),
            fast_forward=fast,
        )
        result, ups = sim.run_then(
            lambda s: {
                n: savings._up_seconds(d.timeline, s.clock.t) for n, d in s.cluster.drivers.items()
            }
        )
        assert result.ok, result.summary()
        starts = {n: len(d.cold_starts) for n, d in sim.cluster.drivers.items()}
        figures.append((ups, starts, result.stats))
    (slow_up, slow_starts, slow_stats), (fast_up, fast_starts, fast_stats) = figures
    assert fast_starts == slow_starts
    # A step's jitter can move a scale-down to the next beat tick: at most one tick per start.
    tick = world.housekeeping_interval_s
    for net in nets:
        bound = tick * slow_starts[net] + 1.0
        assert math.isclose(fast_up[net], slow_up[net], abs_tol=bound), (fast_up, slow_up)
    assert fast_stats["messages"] < slow_stats["messages"] / 3  # and it is what makes it fast


def test_fast_forward_refuses_a_faulty_world():
    from tests.sim.profiles import PROFILES_BY_NAME

    world = savings.world_for(_trace((0.0, 1.0)), ["net-1"], 0.0, COLD)
    with pytest.raises(ValueError, match="fault-free"):
        Simulation(
            world,
            savings.workload_for(_trace((0.0, 1.0))),
            PROFILES_BY_NAME["crashy"],
            0,
            fast_forward=True,
        )


# --- the command line --------------------------------------------------------------------------


def test_simulate_prints_a_row_per_grace_and_the_recommendation(capsys, tmp_path: Path):
    path = tmp_path / "t.csv"
    # A job every 200 s: grace 0 starts a server for each (every job waits one cold start,
    # within the default budget), 600 s keeps it up from the first on.
    path.write_text("submitted_at,duration_s\n" + "".join(f"{200 * i},60\n" for i in range(20)))
    code = main(
        [str(a) for a in ("simulate", path, "--grace", "0,600", "--nets", "1", "--workers", "1")]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "20 jobs on 1 nets" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("0s", "10m"))]
    assert [r[0] for r in rows] == ["0s", "10m"]
    assert "recommended grace: 0s" in out
    assert "budget, one cold start as the dispatcher sees it, 18.6s = 16.6s" in out

    # A budget below one cold start leaves only the grace that avoids them.
    argv = ("simulate", path, "--grace", "0,600", "--nets", "1", "--wait-budget", "5")
    assert main([str(a) for a in argv]) == 0
    assert "recommended grace: 10m" in capsys.readouterr().out

    # A budget of a minute lets the cheapest grace through.
    argv = ("simulate", path, "--grace", "0,600", "--nets", "1", "--json", "--wait-budget", "60")
    code = main([str(a) for a in argv])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [r["grace_s"] for r in data["results"]] == [0.0, 600.0]
    assert data["recommended_s"] == 0.0 and data["wait_budget_s"] == 60.0
    assert data["always_on_h"] == pytest.approx((200 * 19 + 60) / 3600, abs=1e-3)
    first, second = data["results"]
    assert first["cold_starts"] == first["cold_waits"] == 20
    assert second["cold_starts"] == second["cold_waits"] == 1
    assert first["wait_p95_s"] > savings.LOCAL.total_s
    assert second["wait_p95_s"] < 1.0  # the steps' own jitter, no cold start
    assert first["server_h"] < second["server_h"]
    assert data["cold_start"]["total_s"] == savings.LOCAL.total_s


# The command in a fresh interpreter where the test tree cannot be imported: the product's
# simulator must run on app/sim alone (issue 37: the bug-hunting harness lives in tests/sim).
WITHOUT_TESTS = """
import importlib.abc, sys
class NoTests(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "tests" or name.startswith("tests."):
            raise ImportError(f"the product imports {name}")
        return None
sys.meta_path.insert(0, NoTests())
from app.entrypoints.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_simulate_runs_without_the_test_tree(tmp_path: Path):
    import subprocess
    import sys

    path = tmp_path / "t.csv"
    path.write_text("submitted_at,duration_s\n0,60\n300,60\n")
    args = ["simulate", str(path), "--grace", "0", "--nets", "1", "--workers", "1", "--json"]
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TESTS, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert [r["grace_s"] for r in report["results"]] == [0.0]
    assert report["results"][0]["cold_starts"] == 2


def test_simulate_names_the_bad_lines_and_fails(capsys, tmp_path: Path):
    path = tmp_path / "bad.csv"
    path.write_text("submitted_at,duration_s\n0,120\n5,-1\n")
    code = main(["simulate", str(path)])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert f"fl-dispatcher: {path}:3: duration_s: -1 must be > 0" in err


def test_simulate_synthetic_writes_its_trace_and_a_plot(capsys, tmp_path: Path):
    trace_path, png = tmp_path / "synthetic.jsonl", tmp_path / "plot.png"
    argv = ["simulate", "--synthetic", "--days", "0.5", "--seed", "4", "--grace", "0,300"]
    argv += ["--write-trace", str(trace_path), "--plot", str(png), "--json", "--workers", "1"]
    code = main(argv)
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    again = parse_trace(trace_path.read_text(), "again")
    assert len(again.jobs) == data["jobs"] == len(synthesize(Synthetic(seed=4, days=0.5)).jobs)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

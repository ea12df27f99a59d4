"""`fl-dispatcher simulate` with prewarm hints (issue 25): the trace's `hint_lead_s` field,
its validator and writer; the synthetic share of hinted jobs; replays that send each hint as
flip-api's `prewarm` task through the message layer (the real hold logic), on the fast clock
as on the step-by-step one."""

from __future__ import annotations

import json
import math

import pytest

from app.entrypoints.cli import main
from app.sim import savings, savings_table
from app.sim.forked import in_processes
from app.sim.savings import replay
from app.sim.simulation import Simulation
from app.sim.trace import (
    Synthetic,
    Trace,
    TraceError,
    TraceJob,
    format_trace,
    parse_trace,
    synthesize,
)
from app.sim.workload import ColdStart
from tests.unit.test_simulate import COLD  # the 10 s cold start of the replay tests

# --- the trace field ---------------------------------------------------------------------------


def test_a_hint_is_read_from_csv_and_an_empty_cell_is_no_hint():
    text = "submitted_at,duration_s,hint_lead_s\n300,60,120\n400,60,\n500,60,0\n600,60,null\n"
    trace = parse_trace(text, "h.csv")
    assert [j.hint_lead_s for j in trace.jobs] == [120.0, None, 0.0, None]
    assert [j.hinted_at for j in trace.jobs] == [180.0, None, 500.0, None]
    assert trace.hinted() == 2
    assert trace.without_hints().hinted() == 0
    assert [j.submitted_at for j in trace.without_hints().jobs] == [300, 400, 500, 600]


def test_a_hint_is_read_from_json_lines_and_null_is_no_hint():
    text = (
        '{"submitted_at": 300, "duration_s": 60, "hint_lead_s": 90.5}\n'
        '{"submitted_at": 400, "duration_s": 60, "hint_lead_s": null}\n'
        '{"submitted_at": 500, "duration_s": 60}\n'
    )
    assert [j.hint_lead_s for j in parse_trace(text, "h.jsonl").jobs] == [90.5, None, None]


def test_timestamps_count_from_the_first_hint_when_it_comes_before_every_submission():
    text = (
        '{"submitted_at": "2026-03-01T10:00:00Z", "duration_s": 60}\n'
        '{"submitted_at": "2026-03-01T10:01:00Z", "duration_s": 60, "hint_lead_s": 300}\n'
    )
    trace = parse_trace(text, "t.jsonl")
    # The hint at 09:56 is the trace's start: the jobs come 240 s and 300 s after it.
    assert [(j.submitted_at, j.hinted_at) for j in trace.jobs] == [(240.0, None), (300.0, 0.0)]


def test_the_validator_names_every_bad_hint():
    text = (
        "submitted_at,duration_s,hint_lead_s\n"
        "100,60,30\n"
        "100,60,-5\n"
        "100,60,soon\n"
        "100,60,inf\n"
        "100,60,200\n"
        "100000,60,90000\n"
    )
    with pytest.raises(TraceError) as caught:
        parse_trace(text, "h.csv")
    assert caught.value.problems == [
        "h.csv:3: hint_lead_s: -5 must be seconds >= 0 (or empty for no hint)",
        "h.csv:4: hint_lead_s: 'soon' is not a number",
        "h.csv:5: hint_lead_s: 'inf' is not a finite number",
        "h.csv:6: hint_lead_s: 200 puts the hint before the trace's start (submitted_at 100)",
        "h.csv:7: hint_lead_s: 90000 is over 86400, the longest hint a prewarm may carry",
    ]


def test_the_validator_refuses_a_json_hint_that_is_not_a_number():
    text = (
        '{"submitted_at": 100, "duration_s": 60, "hint_lead_s": true}\n'
        '{"submitted_at": 100, "duration_s": 60, "hint_lead_s": "60"}\n'  # as CSV gives it: fine
        '{"submitted_at": 100, "duration_s": 60, "hint_lead_s": [1]}\n'
    )
    with pytest.raises(TraceError) as caught:
        parse_trace(text, "h.jsonl")
    assert caught.value.problems == [
        "h.jsonl:1: hint_lead_s: True is not a number",
        "h.jsonl:3: hint_lead_s: [1] is not a number",
    ]


def _hinted() -> Trace:
    return Trace(
        (
            TraceJob(10.0, 60.0, hint_lead_s=10.0),
            TraceJob(200.0, 30.0, "net-b", ("site-1",), 2),
            TraceJob(400.5, 30.0, hint_lead_s=120.25),
        )
    )


def _fields(trace: Trace) -> list[tuple[object, ...]]:
    return [
        (j.submitted_at, j.duration_s, j.net, j.required_sites, j.priority, j.hint_lead_s)
        for j in trace.jobs
    ]


@pytest.mark.parametrize("jsonl", [False, True])
def test_hints_are_written_back_and_read_again(jsonl: bool):
    trace = _hinted()
    again = parse_trace(format_trace(trace, jsonl=jsonl), "again")
    assert _fields(again) == _fields(trace)


def test_a_trace_without_hints_is_written_as_before_hints_existed():
    trace = _hinted().without_hints()
    assert format_trace(trace).splitlines()[0] == (
        "submitted_at,duration_s,net,required_sites,priority"
    )
    assert "hint_lead_s" not in format_trace(trace, jsonl=True)
    hinted = format_trace(_hinted())
    assert hinted.splitlines()[0].endswith(",priority,hint_lead_s")
    assert hinted.splitlines()[2].endswith(",2,")  # the job without a hint: an empty cell
    assert '"hint_lead_s": 120.25' in format_trace(_hinted(), jsonl=True)


# --- the synthetic trace ---------------------------------------------------------------------


def test_the_synthetic_trace_has_no_hints_unless_asked():
    trace = synthesize(Synthetic(seed=2, days=3))
    assert trace.hinted() == 0 and trace.source == "synthetic(seed=2)"


def test_hinted_synthetic_jobs_are_the_same_jobs_with_a_share_hinted_at_the_lead():
    plain = synthesize(Synthetic(seed=5))
    hinted = synthesize(Synthetic(seed=5, hinted=0.5, hint_lead_s=120.0))
    assert hinted == synthesize(Synthetic(seed=5, hinted=0.5, hint_lead_s=120.0))
    # The same jobs (hints come from a stream of their own), about half of them hinted.
    assert hinted.without_hints().jobs == plain.jobs
    assert 0.45 <= hinted.hinted() / len(hinted.jobs) <= 0.55
    leads = {j.hint_lead_s for j in hinted.jobs if j.submitted_at >= 120.0}
    assert leads == {None, 120.0}
    # A job sooner than the lead after the start is hinted at the start, never before it.
    assert all(j.hinted_at is None or j.hinted_at >= 0 for j in hinted.jobs)
    assert "0.5 hinted 120s ahead" in hinted.source
    everyone = synthesize(Synthetic(seed=5, hinted=1.0, hint_lead_s=30.0))
    assert everyone.hinted() == len(everyone.jobs)


@pytest.mark.parametrize(("share", "lead"), [(-0.1, 120.0), (1.5, 120.0), (0.5, -1.0)])
def test_hint_settings_no_trace_can_have_are_refused(share: float, lead: float):
    with pytest.raises(ValueError, match="hint"):
        synthesize(Synthetic(days=1, hinted=share, hint_lead_s=lead))


def test_simulate_writes_a_hinted_synthetic_trace(capsys, tmp_path):
    path = tmp_path / "hinted.csv"
    argv = ["simulate", "--synthetic", "--days", "0.3", "--seed", "1", "--grace", "0"]
    argv += ["--hinted", "0.5", "--hint-lead", "60", "--write-trace", str(path), "--json"]
    assert main([*argv, "--workers", "1"]) == 0, capsys.readouterr().err
    written = parse_trace(path.read_text(), "written")
    expected = synthesize(Synthetic(seed=1, days=0.3, hinted=0.5, hint_lead_s=60.0))
    assert [j.hint_lead_s for j in written.jobs] == [j.hint_lead_s for j in expected.jobs]
    assert written.hinted() > 0


# --- replays with hints -------------------------------------------------------------------------


def test_a_hinted_job_meets_a_warm_server_and_pays_for_the_lead():
    trace = Trace((TraceJob(1000.0, 200.0, hint_lead_s=120.0),))
    warm = replay(trace.without_hints(), ["net-1"], None, COLD)
    plain = replay(trace.without_hints(), ["net-1"], 0.0, COLD)
    hinted = replay(trace, ["net-1"], 0.0, COLD)
    assert plain.waits[0] - warm.waits[0] >= COLD.total_s and plain.cold_waits == 1
    # The hint at 880 s started the server; the job at 1000 s found it ready.
    assert hinted.waits[0] - warm.waits[0] < 1.0
    assert hinted.cold_starts == 1 and hinted.cold_waits == 0
    assert (hinted.hints, hinted.hints_used, hinted.hints_refused) == (1, 1, 0)
    assert (plain.hints, plain.hints_used) == (0, 0)
    # Up from the hint instead of from the job: the lead, less the cold start the job no
    # longer waits for (each scale-down on its own beat tick, HOUSEKEEPING_INTERVAL_S 15).
    extra = hinted.up_s - plain.up_s
    assert 120 - COLD.total_s - 15 <= extra <= 120 - COLD.total_s + 15
    assert hinted.unfinished == 0


def test_a_hint_shorter_than_the_cold_start_hides_part_of_it():
    trace = Trace((TraceJob(1000.0, 60.0, hint_lead_s=4.0),))
    warm = replay(trace.without_hints(), ["net-1"], None, COLD)
    hinted = replay(trace, ["net-1"], 0.0, COLD)
    added = hinted.waits[0] - warm.waits[0]
    # The server was asked for 4 s early: 6 s of the 10 s cold start are left, and the job's
    # own readiness poll (READY_POLL_S, 1 s) sees it up to a poll later.
    assert COLD.total_s - 4.0 <= added <= COLD.total_s - 4.0 + 2.0
    assert hinted.hints_used == 1


def test_a_hint_holds_the_net_the_job_names():
    trace = Trace(
        (
            TraceJob(500.0, 60.0, "net-b", hint_lead_s=60.0),
            TraceJob(510.0, 60.0, "net-a"),
        )
    )
    hinted = replay(trace, ["net-a", "net-b"], 0.0, COLD)
    warm = replay(trace.without_hints(), ["net-a", "net-b"], None, COLD)
    assert hinted.waits[0] - warm.waits[0] < 1.0  # net-b warm for its job
    assert hinted.waits[1] - warm.waits[1] >= COLD.total_s  # net-a was not hinted
    assert hinted.hints_used == 1


def _fast_and_slow(trace: Trace, nets: tuple[str, ...], grace: float, cold: ColdStart):
    """Each net's up-time and cold starts, and each job's wait, stepping through every beat
    tick and on the fast clock."""
    world = savings.world_for(trace, nets, grace, cold)
    workload = savings.workload_for(trace)
    figures = []
    for fast in (False, True):
        # (The invariants do not know holds yet: a held idle server is idle-net-at-zero.)
        sim = Simulation(world, workload, savings.CLEAN, 0, fast_forward=fast)

        def read(s: Simulation) -> tuple[dict[str, float], list[str]]:
            ups = {
                n: savings._up_seconds(d.timeline, s.clock.t) for n, d in s.cluster.drivers.items()
            }
            waits = [
                dispatched
                for (dispatched,) in s.conn.execute(
                    "SELECT dispatched_at FROM jobs ORDER BY created_at"
                )
            ]
            return ups, waits

        result, (ups, waits) = sim.run_then(read)
        assert result.ok, result.summary()
        starts = {n: len(d.cold_starts) for n, d in sim.cluster.drivers.items()}
        figures.append((ups, starts, [savings._secs(w) for w in waits], result.stats))
    return world, figures


def test_a_hint_finding_its_net_stopping_starts_it_again_once_it_is_down():
    """The fast clock must not skip the scale-down round whose settling starts a held net
    again: here the net is STOPPING (a 30 s stop) when the hint comes."""
    cold = ColdStart("slow-stop", provision_s=2.0, login_s=3.0, sites_s=5.0, stop_s=30.0)
    trace = Trace((TraceJob(0.0, 60.0), TraceJob(200.0, 60.0, hint_lead_s=100.0)))
    world, [(slow_up, slow_starts, slow_waits, _), (fast_up, fast_starts, fast_waits, _)] = (
        _fast_and_slow(trace, ("net-1",), 0.0, cold)
    )
    assert slow_starts == fast_starts == {"net-1": 2}
    assert math.isclose(fast_up["net-1"], slow_up["net-1"], abs_tol=world.housekeeping_interval_s)
    # Started again between its stop (120 s) and the job (200 s): the job found it warm.
    assert fast_waits[1] - 200.0 < 1.0 and slow_waits[1] - 200.0 < 1.0


def test_the_fast_clock_changes_no_figure_with_hints():
    """Hints on a held idle net, on a stopped one, one used by another job, one sent while
    its net is busy: the fast clock gives the figures of stepping through every tick."""
    trace = Trace(
        (
            TraceJob(0.0, 300.0, hint_lead_s=0.0),
            TraceJob(20.0, 100.0),
            TraceJob(200.0, 50.0, hint_lead_s=150.0),
            TraceJob(330.0, 40.0, hint_lead_s=100.0),
            TraceJob(900.0, 120.0, hint_lead_s=300.0),
            TraceJob(1000.0, 30.0, hint_lead_s=30.0),
            TraceJob(1400.0, 20.0, hint_lead_s=60.0),
        )
    )
    nets = ("net-1", "net-2")
    (
        world,
        [
            (slow_up, slow_starts, slow_waits, slow_stats),
            (fast_up, fast_starts, fast_waits, fast_stats),
        ],
    ) = _fast_and_slow(trace, nets, 100.0, COLD)
    assert fast_starts == slow_starts
    tick = world.housekeeping_interval_s
    for net in nets:
        bound = tick * slow_starts[net] + 1.0
        assert math.isclose(fast_up[net], slow_up[net], abs_tol=bound), (fast_up, slow_up)
    for slow, fast in zip(slow_waits, fast_waits, strict=True):
        assert abs(slow - fast) < 1.5, (slow_waits, fast_waits)
    assert fast_stats["messages"] < slow_stats["messages"] / 3


def test_a_hold_used_by_another_job_ends_at_that_claim_on_the_fast_clock_too():
    """Another job takes the held net first: the hold is used and ends there (the real
    claim's rule), so the net's grace runs from that job's end and the hinted job, later,
    meets a cold start; the fast clock must start the grace where the scale-down does."""
    trace = Trace((TraceJob(150.0, 30.0), TraceJob(400.0, 30.0, hint_lead_s=300.0)))
    world, [(slow_up, slow_starts, slow_waits, _), (fast_up, fast_starts, fast_waits, _)] = (
        _fast_and_slow(trace, ("net-1",), 0.0, COLD)
    )
    assert slow_starts == fast_starts == {"net-1": 2}
    assert math.isclose(fast_up["net-1"], slow_up["net-1"], abs_tol=world.housekeeping_interval_s)
    for waits in (slow_waits, fast_waits):
        assert waits[0] - 150.0 < 1.0  # the unhinted job found the hinted server warm
        assert waits[1] - 400.0 >= COLD.total_s  # and the hinted one met a cold start


def test_the_fast_clock_skips_what_a_hold_makes_idle():
    """A hint ten minutes ahead: the warm-up's readiness polls jump to the one that sees the
    server ready, and no scale-down round runs while the hold defers the grace (each would
    only read the tables): a month of hints costs messages per hint, not per second."""
    trace = Trace((TraceJob(1000.0, 60.0, hint_lead_s=600.0),))
    world = savings.world_for(trace, ["net-1"], 0.0, COLD)
    sim = Simulation(
        world,
        savings.workload_for(trace),
        savings.CLEAN,
        0,
        tracing=True,
        fast_forward=True,
    )
    result = sim.run()
    sent = [
        line.split("#", 1)[1].split()[1].split("(")[0] for line in result.trace if " w0 #" in line
    ]
    assert sent.count("warm_up") == 2  # asks for the replica, then sees it ready
    assert sent.count("scale_down_idle_nets") == 1  # the one after the job, that stops it
    assert sim.cluster.drivers["net-1"].timeline[0][0] == pytest.approx(400.0, abs=1.0)


# --- the report ------------------------------------------------------------------------------


def _spread(hinted: bool) -> Trace:
    """A job every 200 s on one net: at grace 0 each meets a cold start unless hinted."""
    lead = 60.0 if hinted else None
    return Trace(
        tuple(
            TraceJob(300.0 + 200.0 * i, 60.0, hint_lead_s=lead if i % 2 == 0 else None)
            for i in range(8)
        )
    )


def test_the_report_has_each_grace_with_and_without_hints():
    trace = _spread(hinted=True)
    report = savings.simulate(trace, ["net-1"], (0.0, 600.0), COLD)
    assert report.hinted_jobs == 4 and report.hint_margin_s == savings.HINT_MARGIN_S
    plain = {r.grace_s: r for r in report.results}
    hinted = {r.grace_s: r for r in report.hinted_results}
    assert set(plain) == set(hinted) == {0.0, 600.0}
    # Without hints, grace 0 starts a server for every job; with them, the hinted half finds
    # it warm, and pays for the server from the hint on.
    assert plain[0.0].cold_waits == 8 and hinted[0.0].cold_waits == 4
    assert (hinted[0.0].hints, hinted[0.0].hints_used, hinted[0.0].hints_refused) == (4, 4, 0)
    assert hinted[0.0].wait_p50_s < 1.0 < COLD.total_s <= plain[0.0].wait_p50_s
    assert hinted[0.0].server_h > plain[0.0].server_h
    # A grace longer than the gaps keeps the server up from the first job on: hints change
    # nothing there but the first job's start.
    assert plain[600.0].cold_starts == hinted[600.0].cold_starts == 1
    assert report.hinted_recommended_s is not None
    data = report.to_json()
    assert [r["grace_s"] for r in data["hinted_results"]] == [0.0, 600.0]
    assert data["hinted_results"][0]["hints_used"] == 4 and data["hinted_jobs"] == 4


def test_the_hinted_jobs_own_p95_is_reported_with_and_without_their_hints():
    """Half the jobs hinted: the p95 of every job stays a cold start (the unhinted half),
    so the hints' effect is read on the jobs flip-api hinted, against the same jobs unhinted."""
    report = savings.simulate(_spread(hinted=True), ["net-1"], (0.0,), COLD)
    [plain], [hinted] = report.results, report.hinted_results
    assert hinted.wait_p95_s >= COLD.total_s  # the unhinted half still waits a cold start
    assert hinted.hinted_p95_none_s >= COLD.total_s  # the hinted jobs, replayed without hints
    assert hinted.hinted_p95_s < 1.0  # ... and with them: a warm server
    assert report.to_json()["hinted_results"][0]["hinted_p95_s"] == hinted.hinted_p95_s
    lines = savings_table.table(report).splitlines()
    zero = lines[lines.index("hints against none:") + 2].split()
    assert zero[-2:] == [f"{hinted.hinted_p95_none_s:.1f}s", f"{hinted.hinted_p95_s:.1f}s"]
    assert plain.wait_p95_s >= COLD.total_s


def test_a_report_without_hints_is_as_before():
    report = savings.simulate(_spread(hinted=False), ["net-1"], (0.0,), COLD)
    assert report.hinted_jobs == 0 and report.hinted_results == ()
    data = report.to_json()
    assert not {"hinted_jobs", "hint_margin_s", "hinted_results", "hinted_recommended_s"} & set(
        data
    )
    text = savings_table.table(report)
    assert "hint" not in text


def test_the_table_shows_hinted_rows_and_their_difference():
    report = savings.simulate(_spread(hinted=True), ["net-1"], (0.0, 600.0), COLD)
    text = savings_table.table(report)
    assert "without prewarm hints:" in text
    assert "with prewarm hints (4 of 8 jobs hinted; a hint asks for its lead + 15s):" in text
    assert "recommended grace with hints:" in text
    lines = text.splitlines()
    start = lines.index("hints against none:")
    zero = lines[start + 2].split()
    plain, hinted = report.results[0], report.hinted_results[0]
    assert zero[:4] == [
        "0s",
        f"{plain.server_h:.1f}",
        f"{hinted.server_h:.1f}",
        f"{hinted.server_h - plain.server_h:+.2f}",
    ]
    assert zero[-4:-2] == [f"{plain.wait_p95_s:.1f}s", f"{hinted.wait_p95_s:.1f}s"]
    rows = [line for line in lines if line.strip().startswith("0s") and " of " in line]
    assert rows and "4 of 4" in rows[0]  # hints used of hints sent


def test_simulate_json_carries_the_hinted_figures_of_a_hinted_trace(capsys, tmp_path):
    path = tmp_path / "hinted.csv"
    path.write_text(format_trace(_spread(hinted=True)))
    argv = ["simulate", str(path), "--grace", "0", "--nets", "1", "--json", "--workers", "2"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hinted_jobs"] == 4
    assert data["hinted_results"][0]["wait_p50_s"] < 1.0 < data["results"][0]["wait_p50_s"]


# --- progress ------------------------------------------------------------------------------------


def _square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("workers", [1, 2])
def test_calls_in_processes_come_back_in_order_and_each_is_reported(workers: int):
    seen: list[tuple[int, int, int]] = []
    results = in_processes(_square, [3, 1, 2, 5], workers, lambda *a: seen.append(a))
    assert results == [9, 1, 4, 25]
    assert [count for count, _, _ in seen] == [1, 2, 3, 4]
    assert sorted((index, result) for _, index, result in seen) == [(0, 9), (1, 1), (2, 4), (3, 25)]


@pytest.mark.parametrize("workers", [1, 2])
def test_simulate_reports_each_replay_as_it_ends(workers: int):
    lines: list[str] = []
    savings.simulate(
        _spread(hinted=True), ["net-1"], (0.0, 60.0), COLD, workers=workers, progress=lines.append
    )
    assert lines[0] == f"5 replays of 8 jobs, {workers} at a time"
    assert [line.split(" replayed: ")[0] for line in lines[1:]] == [f"{i}/5" for i in range(1, 6)]
    done = sorted(line.split(" replayed: ")[1].split(" in ")[0] for line in lines[1:])
    assert done == [
        "always on",
        "grace 0s",
        "grace 0s with hints",
        "grace 60s",
        "grace 60s with hints",
    ]


def test_simulate_shows_progress_on_stderr_and_only_the_report_on_stdout(capsys, tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(format_trace(_spread(hinted=False)))
    argv = ["simulate", str(path), "--grace", "0,60", "--nets", "1", "--json", "--workers", "1"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["jobs"] == 8  # nothing else on stdout
    progress = [line for line in err.splitlines() if line.startswith("fl-dispatcher simulate: ")]
    assert len(progress) == 4  # the plan, then the always-on replay and one per grace
    assert progress[-1].startswith("fl-dispatcher simulate: 3/3 replayed: grace ")

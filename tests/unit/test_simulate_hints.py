"""`fl-dispatcher simulate` with prewarm hints (issue 25): the trace's `hint_lead_s` field,
its validator and writer."""

from __future__ import annotations

import pytest

from app.entrypoints.cli import main
from app.sim.trace import (
    Synthetic,
    Trace,
    TraceError,
    TraceJob,
    format_trace,
    parse_trace,
    synthesize,
)

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

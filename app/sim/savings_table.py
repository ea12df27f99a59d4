"""`fl-dispatcher simulate`'s output for people: the table (`table`) and the plot (`plot`)
of a `savings.Report`, with the hinted replays' rows and their comparison when the trace
has prewarm hints."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.sim.savings import GraceResult, HintedResult, Report, _default, seen_cold_start_s


def table(report: Report) -> str:
    """The report as a human table."""
    cold = report.cold_start
    lines = [
        f"trace {report.source}: {report.jobs} jobs on {len(report.nets)} nets over "
        f"{report.horizon_h:.1f} h, utilization {100 * report.utilization:.1f}%",
        f"cold start ({cold.name}): {cold.total_s:.1f}s = provision {cold.provision_s:g}s"
        f" + login {cold.login_s:g}s + sites {cold.sites_s:g}s",
        f"always on: {report.always_on_h:.1f} server-hours",
        "",
    ]
    if report.hinted_jobs:
        lines.append("without prewarm hints:")
    lines += _rows(report.results, report.recommended_s)
    lines.append("")
    budget = (
        f"one cold start as the dispatcher sees it, {report.wait_budget_s:.1f}s ="
        f" {cold.total_s:.1f}s + READY_POLL_S {_default('ready_poll_s'):g}s"
        f" + AWAITED_POLL_S {_default('awaited_poll_s'):g}s"
        if report.wait_budget_s == seen_cold_start_s(cold)
        else f"{report.wait_budget_s:g}s"
    )
    if report.recommended_s is None:
        lines.append(f"no grace keeps the p95 added wait within the budget ({budget})")
    else:
        lines.append(
            f"recommended grace: {_dur(report.recommended_s)} (the cheapest whose p95 added"
            f" wait stays within the budget, {budget})"
        )
    if report.hinted_jobs:
        lines += ["", *_hinted(report)]
    lines.append(f"simulated in {report.wall_s:.1f}s")
    return "\n".join(lines)


def _rows(results: Sequence[GraceResult], recommended: float | None) -> list[str]:
    hinted = any(isinstance(r, HintedResult) for r in results)
    lines = [
        f"{'grace':>7} {'server-h':>9} {'saved-h':>8} {'saved':>7} {'cold':>5}"
        f" {'wait p50':>9} {'p95':>7} {'max':>7} {'cold-waited':>11}"
        + (f" {'hints used':>13}" if hinted else "")
    ]
    for r in results:
        mark = "  <- recommended" if r.grace_s == recommended else ""
        used = f" {f'{r.hints_used} of {r.hints}':>13}" if isinstance(r, HintedResult) else ""
        lines.append(
            f"{_dur(r.grace_s):>7} {r.server_h:9.1f} {r.saved_h:8.1f} {r.saved_pct:6.1f}%"
            f" {r.cold_starts:5d} {r.wait_p50_s:8.1f}s {r.wait_p95_s:6.1f}s"
            f" {r.wait_max_s:6.1f}s {r.cold_waits:11d}{used}{mark}"
        )
        if r.unfinished:
            lines.append(f"        ({r.unfinished} job(s) did not complete)")
        if isinstance(r, HintedResult) and r.hints_refused:
            lines.append(f"        ({r.hints_refused} hint(s) refused by the dispatcher)")
    return lines


def _hinted(report: Report) -> list[str]:
    """The replays with hints: their rows, their recommendation, and per grace the
    server-hours and p95 added wait against the replay without hints, of every job and of
    the hinted jobs alone."""
    lines = [
        f"with prewarm hints ({report.hinted_jobs} of {report.jobs} jobs hinted; a hint asks"
        f" for its lead + {report.hint_margin_s:g}s):",
        *_rows(report.hinted_results, report.hinted_recommended_s),
        "",
    ]
    if report.hinted_recommended_s is None:
        lines.append("with hints, no grace keeps the p95 added wait within the budget")
    else:
        lines.append(f"recommended grace with hints: {_dur(report.hinted_recommended_s)}")
    lines += [
        "",
        "hints against none:",
        f"{'grace':>7} {'server-h none':>14} {'hints':>8} {'diff':>7} {'saved pts':>10}"
        f" {'p95 none':>9} {'hints':>7} {'hinted jobs p95 none':>21} {'hints':>7}",
    ]
    for plain, hinted in zip(report.results, report.hinted_results, strict=True):
        lines.append(
            f"{_dur(plain.grace_s):>7} {plain.server_h:14.1f} {hinted.server_h:8.1f}"
            f" {hinted.server_h - plain.server_h:+7.2f} {hinted.saved_pct - plain.saved_pct:+10.2f}"
            f" {plain.wait_p95_s:8.1f}s {hinted.wait_p95_s:6.1f}s"
            f" {hinted.hinted_p95_none_s:20.1f}s {hinted.hinted_p95_s:6.1f}s"
        )
    lines.append("")
    return lines


def _dur(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


def plot(report: Report, path: Path) -> None:
    """A PNG of saved % against p95 added wait, one labelled point per grace (matplotlib's
    Agg backend: no display needed). ImportError if matplotlib is not installed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    try:
        xs = [r.wait_p95_s for r in report.results]
        ys = [r.saved_pct for r in report.results]
        ax.plot(xs, ys, "o-", color="tab:blue")
        for i, r in enumerate(report.results):
            best = r.grace_s == report.recommended_s
            ax.annotate(
                f"grace {_dur(r.grace_s)}" + (" (recommended)" if best else ""),
                (r.wait_p95_s, r.saved_pct),
                textcoords="offset points",
                xytext=(8, -3) if i % 2 == 0 else (-8, -3),
                ha="left" if i % 2 == 0 else "right",
                fontsize=8,
                fontweight="bold" if best else "normal",
            )
        cold = report.cold_start.total_s
        ax.axvline(cold, color="tab:red", linestyle="--", linewidth=1)
        mid = (min(ys, default=0) + max(ys, default=0)) / 2
        ax.text(cold, mid, "one cold start ", color="tab:red", fontsize=8, rotation=90, ha="right")
        seen = report.wait_budget_s == seen_cold_start_s(report.cold_start)
        ax.axvline(report.wait_budget_s, color="tab:green", linestyle=":", linewidth=1)
        label = "wait budget" + (" (one cold start + the two polls)" if seen else "")
        ax.text(
            report.wait_budget_s,
            mid,
            label + " ",
            color="tab:green",
            fontsize=8,
            rotation=90,
            ha="right",
            va="center",
        )
        if report.hinted_results:
            ax.plot(
                [r.wait_p95_s for r in report.hinted_results],
                [r.saved_pct for r in report.hinted_results],
                "s--",
                color="tab:orange",
                label=f"with prewarm hints ({report.hinted_jobs} of {report.jobs} jobs)",
            )
            ax.plot([], [], "o-", color="tab:blue", label="without hints")
            ax.legend(fontsize=8, loc="lower right")
        ax.set_xlabel("p95 added wait per job (s)")
        ax.set_ylabel("server-hours saved vs always on (%)")
        ax.set_title(
            f"{report.jobs} jobs, {len(report.nets)} nets, {report.horizon_h / 24:.1f} days,"
            f" utilization {100 * report.utilization:.0f}%, cold start {cold:.1f}s",
            fontsize=9,
        )
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)

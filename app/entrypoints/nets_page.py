"""The nets page (GET /nets) as HTML: one self-contained document, no script, no external
file, so it works air-gapped and in any browser; it reloads itself (meta refresh).

Rendering only: what it shows comes from `app.usecases.net_history.nets_overview`. Every
value from the database is escaped.
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from urllib.parse import quote

from app.usecases.net_history import COLD_STARTS_SHOWN, KINDS, NetNow, NetPanel, Overview, Segment
from models import attempt_number

REFRESH_S = 30

_CSS = """
:root{--fg:#1d2330;--muted:#5f6b7a;--line:#dde2e8;--bg:#f6f7f9;--card:#fff;
--up:#6cc283;--starting:#f2b84b;--busy:#2f6fde;--finishing:#8d63d2;--stopping:#9aa7b5;
--down:#e3e7ec;--unhealthy:#ef7d32;--outage:#d33c3c;--misconfigured:#8f1414;--unknown:#f6f7f9}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
color:var(--fg);background:var(--bg)}
header{background:#1d2330;color:#fff;padding:12px 20px}
header h1{font-size:19px;margin:0 8px 0 0;display:inline}
header .meta{color:#b7c0cc;font-size:13px}
header a{color:#fff}
main{padding:14px 20px;max-width:1400px;margin:0 auto}
.summary{display:flex;flex-wrap:wrap;gap:8px;margin:0 0 14px}
.chip{background:var(--card);border:1px solid var(--line);border-radius:14px;padding:3px 11px;
font-size:13.5px}
.chip b{font-weight:600}
.drain{background:#fff8e6;border:1px solid #f0d08a;border-left:5px solid var(--starting);
border-radius:6px;padding:8px 14px;margin:10px 0}
.drain h2{font-size:15px;margin:2px 0 4px;color:#7a5200}
.drain p{margin:2px 0}
.attention{background:#fff4f2;border:1px solid #f1c2ba;border-left:5px solid var(--outage);
border-radius:6px;padding:8px 14px;margin:0 0 16px}
.attention h2{font-size:15px;margin:2px 0 4px;color:#8f1414}
.attention ul{margin:0;padding-left:18px}
.attention li{margin:2px 0}
.pager{margin:10px 0;font-size:14px;color:var(--muted)}
h2.section{font-size:16px;margin:18px 0 8px}
.nets{margin:10px 0;display:grid;gap:12px;
grid-template-columns:repeat(auto-fill,minmax(min(100%,420px),1fr))}
.net{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px}
.net.alert{border-color:#e3a096;box-shadow:inset 4px 0 0 var(--outage)}
.net h3{margin:0 0 6px;font-size:16px;display:flex;flex-wrap:wrap;align-items:baseline;gap:6px}
.net h3 a{color:inherit;text-decoration:none}
.net h3 .kind{font-weight:400;color:var(--muted);font-size:13px}
.badge{display:inline-block;border-radius:4px;padding:0 7px;font-size:12.5px;font-weight:600;
letter-spacing:.02em;color:#fff;background:var(--muted)}
.b-up{background:#2f8a4a}.b-starting{background:#b7791f}.b-busy{background:var(--busy)}
.b-finishing{background:var(--finishing)}.b-stopping{background:#6b7785}
.b-down{background:#8a95a3}.b-unhealthy{background:#c85a12}.b-outage{background:var(--outage)}
.b-misconfigured{background:var(--misconfigured)}
.tl{display:flex;height:22px;border-radius:4px;overflow:hidden;background:var(--down);
border:1px solid var(--line)}
.tl i{display:block;height:100%}
.tl .k-starting,.tl .k-stopping,.tl .k-unhealthy,.tl .k-outage{min-width:2px}
.k-up{background:var(--up)}.k-starting{background:var(--starting)}.k-busy{background:var(--busy)}
.k-finishing{background:var(--finishing)}.k-stopping{background:var(--stopping)}
.k-down{background:var(--down)}.k-unhealthy{background:var(--unhealthy)}
.k-outage{background:var(--outage)}
.k-misconfigured{background:repeating-linear-gradient(135deg,var(--misconfigured) 0 6px,
#b83a3a 6px 12px)}
.k-unknown{background:repeating-linear-gradient(135deg,#eef0f3 0 4px,#fff 4px 8px)}
.axis{display:flex;justify-content:space-between;font-size:11.5px;color:var(--muted);
margin:1px 0 6px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0;font-size:14px}
dt{color:var(--muted)}
dd{margin:0;min-width:0;overflow-wrap:anywhere}
.err{color:#9b1c1c}
.late{color:#b42318;font-weight:600}
.legend{display:flex;flex-wrap:wrap;gap:10px;font-size:13px;color:var(--muted);margin:4px 0 0}
.legend span{display:inline-flex;align-items:center;gap:5px}
.legend i{display:inline-block;width:14px;height:12px;border-radius:2px;
border:1px solid var(--line)}
table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line);
border-radius:8px;font-size:14px}
th,td{text-align:left;padding:6px 10px;border-top:1px solid var(--line);vertical-align:top}
th{border-top:0;color:var(--muted);font-weight:600;font-size:13px}
.moves{display:flex;flex-wrap:wrap;gap:3px 4px;align-items:center}
.moves .badge{font-weight:500}
.moves time{font-size:12px;color:var(--muted);margin-right:4px}
.j-QUEUED{background:#6b7785}.j-ASSIGNED{background:#b7791f}.j-DISPATCHING{background:#b7791f}
.j-RUNNING{background:var(--busy)}.j-FINISHING{background:var(--finishing)}
.j-ABORTING{background:#c85a12}.j-COMPLETED{background:#2f8a4a}.j-FAILED{background:var(--outage)}
.j-ABORTED{background:#5f6b7a}
.key{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:13px}
.nowrap{white-space:nowrap}
footer{color:var(--muted);font-size:12.5px;padding:8px 20px 20px;max-width:1400px;margin:0 auto}
@media (max-width:640px){
main{padding:10px}header{padding:10px 12px}
table,thead,tbody,tr,td{display:block}thead{display:none}
tr{border-top:1px solid var(--line);padding:6px 0}td{border:0;padding:2px 10px}
td[data-l]::before{content:attr(data-l) ": ";color:var(--muted)}td:empty{display:none}}
"""

# The timeline's state names as the legend shows them.
_LEGEND = {
    "up": "up, idle",
    "starting": "starting",
    "busy": "busy",
    "finishing": "finishing (results upload)",
    "stopping": "stopping",
    "down": "down",
    "unhealthy": "unhealthy",
    "outage": "outage",
    "misconfigured": "misconfigured",
    "unknown": "no history",
}
_STATE_KIND = {
    "STOPPED": "down",
    "STARTING": "starting",
    "READY": "up",
    "BUSY": "busy",
    "STOPPING": "stopping",
    "UNHEALTHY": "unhealthy",
    "OUTAGE": "outage",
    "MISCONFIGURED": "misconfigured",
}


def duration(seconds: float) -> str:
    """3 s, 4m 05s, 2h 10m, 3d 4h."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _clock(at: datetime, now: datetime) -> str:
    """HH:MM on the day of `now`, else with the day (UTC, as the page says)."""
    if at.date() == now.date():
        return at.strftime("%H:%M")
    return at.strftime("%d %b %H:%M")


def _badge(state: str | None) -> str:
    if state is None:
        return '<span class="badge">NO ROW</span>'
    return f'<span class="badge b-{_STATE_KIND.get(state, "")}">{escape(state)}</span>'


def _timeline(segments: list[Segment], ov: Overview) -> str:
    span = (ov.now - ov.since).total_seconds()
    parts = []
    for seg in segments:
        width = (seg.end - seg.start).total_seconds() / span * 100
        title = (
            f"{_LEGEND[seg.kind]} {_clock(seg.start, ov.now)}\u2013{_clock(seg.end, ov.now)}"
            f" ({duration((seg.end - seg.start).total_seconds())})"
        )
        parts.append(f'<i class="k-{seg.kind}" style="width:{width:.3f}%" title="{title}"></i>')
    return (
        '<div class="tl" role="img" aria-label="last 24 hours">'
        + "".join(parts)
        + '</div><div class="axis"><span>\u221224 h</span><span>\u221218 h</span>'
        "<span>\u221212 h</span><span>\u22126 h</span><span>now</span></div>"
    )


def _net_card(panel: NetPanel, ov: Overview) -> str:
    net = panel.now
    state = net.state.value if net.state else None
    since = f" since {_clock(net.since, ov.now)}" if net.since else ""
    mode = "always on" if net.always_on else f"scale to zero, grace {duration(net.idle_timeout_s)}"
    rows = []
    job = panel.active_job
    if job is not None:
        rows.append(
            (
                "Job",
                f'<span class="key">{escape(job.caller_key)}</span> {_badge_job(job.state.value)}'
                f" since {_clock(job.since, ov.now)}, attempt "
                f"{attempt_number(job.attempts, job.max_attempts)} of {job.max_attempts}",
            )
        )
    else:
        rows.append(("Job", "none"))
    rows.append(("Queue", f"{panel.queued_here} pinned here, {ov.queued_anywhere} for any net"))
    if panel.cold_starts_s:
        shown = ", ".join(duration(s) for s in panel.cold_starts_s[-COLD_STARTS_SHOWN:])
        median = duration(panel.median_cold_start_s or 0)
        count = len(panel.cold_starts_s)
        rows.append(("Cold starts", f"{count} in 24 h, median {median} ({shown})"))
    else:
        rows.append(("Cold starts", "none in 24 h"))
    if net.hold is not None:
        rows.append(
            (
                "Prewarm",
                f'<span class="key">{escape(net.hold.caller_key)}</span> '
                f"{'held' if net.hold.ready else 'warming'} until "
                f"{_clock(net.hold.hold_until, ov.now)}"
                f" ({duration((net.hold.hold_until - ov.now).total_seconds())} left)",
            )
        )
    if net.idle_left_s is not None:
        if net.idle_left_s >= 0:
            rows.append(("Idle grace", f"{duration(net.idle_left_s)} left"))
        else:
            rows.append(
                ("Idle grace", f'<span class="late">{duration(net.idle_left_s)} overdue</span>')
            )
    drained = {n.name: n for n in ov.drain.nets} if ov.drain is not None else {}
    if net.name in drained:
        began = datetime.fromisoformat(drained[net.name].since)
        rows.append(("Drained", f"since {_clock(began, ov.now)}: takes no new job"))
    if net.strays:
        rows.append(("Stray runs", f'<span class="late">{net.strays}</span>'))
    if net.last_error:
        rows.append(("Last error", f'<span class="err">{escape(net.last_error)}</span>'))
    items = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    css = "net alert" if net.needs_attention else "net"
    return (
        f'<article class="{css}" id="net-{escape(net.name)}"><h3>'
        f'<a href="nets?net={quote(net.name)}">{escape(net.name)}</a> {_badge(state)}'
        f'<span class="kind">{since} \u00b7 {mode}</span></h3>'
        f"{_timeline(panel.segments, ov)}<dl>{items}</dl></article>"
    )


def _badge_job(state: str) -> str:
    return f'<span class="badge j-{state}">{state}</span>'


def _reasons(net: NetNow) -> str:
    why: list[str] = []
    if net.state is not None and net.state.value in ("MISCONFIGURED", "OUTAGE", "UNHEALTHY"):
        why.append(net.state.value)
    if net.strays:
        why.append(f"{net.strays} stray run(s)")
    if net.idle_left_s is not None and net.idle_left_s < 0:
        why.append(f"idle {duration(net.idle_left_s)} past its grace")
    detail = f": {escape(net.last_error)}" if net.last_error else ""
    return f"{', '.join(why)}{detail}"


def _attention(ov: Overview) -> str:
    if not ov.attention:
        return ""
    items = "".join(
        f'<li><a href="nets?net={quote(net.name)}">{escape(net.name)}</a> {_reasons(net)}</li>'
        for net in ov.attention
    )
    more = ov.attention_total - len(ov.attention)
    if more > 0:
        items += f"<li>and {more} more (first on the pages below)</li>"
    return f'<section class="attention"><h2>Needs attention</h2><ul>{items}</ul></section>'


def _drain(ov: Overview) -> str:
    """The drain banner (app.usecases.drains): what is drained, and what still runs."""
    drain = ov.drain
    if drain is None or drain.state == "none":
        return ""
    if drain.deployment and drain.deployment_since:
        since = datetime.fromisoformat(drain.deployment_since)
        scope = f"The whole deployment is drained (since {_clock(since, ov.now)})"
    else:
        scope = "Drained: " + ", ".join(escape(n.name) for n in drain.nets)
    busy = [n for n in drain.nets if n.active_job is not None]
    if busy:
        left = "; ".join(
            f"{escape(n.name)}: {escape(n.active_job.caller_key)} {_badge_job(n.active_job.state)}"
            for n in busy
            if n.active_job is not None
        )
        status = f"<b>Draining</b>: still active: {left}."
    else:
        status = "<b>Drained</b>: no drained net has an active job (safe to deploy)."
    return (
        f'<section class="drain"><h2>{scope}</h2><p>{status}</p><p>Drained nets take no new '
        f"job and no prewarm; {drain.queued} queued job(s) wait and run after "
        "<code>fl-dispatcher undrain</code>.</p></section>"
    )


def _pager(ov: Overview) -> str:
    if ov.pages <= 1:
        return ""
    first, last = ov.offset + 1, ov.offset + len(ov.nets)
    links = []
    if ov.page > 1:
        links.append(f'<a href="nets?page={ov.page - 1}">\u2039 previous</a>')
    if ov.page < ov.pages:
        links.append(f'<a href="nets?page={ov.page + 1}">next \u203a</a>')
    return (
        f'<nav class="pager">Nets {first:,}\u2013{last:,} of {ov.total_nets:,}'
        f" (page {ov.page} of {ov.pages}, those that need attention first) "
        + " \u00b7 ".join(links)
        + "</nav>"
    )


def _jobs(ov: Overview) -> str:
    rows = []
    for job in ov.jobs:
        moves = "".join(
            f'<span title="{escape(m.reason)}">{_badge_job(m.state.value)} '
            f"<time>{_clock(m.at, ov.now)}</time></span>"
            for m in job.moves
        )
        attempt = attempt_number(job.attempts, job.max_attempts)
        error = f'<span class="err">{escape(job.last_error)}</span>' if job.last_error else ""
        rows.append(
            f'<tr><td data-l="Job" class="key nowrap">{escape(job.caller_key)}</td>'
            f'<td data-l="Net" class="nowrap">{escape(job.net or "")}</td>'
            f'<td data-l="State">{_badge_job(job.state.value)}</td>'
            f'<td data-l="History"><div class="moves">{moves}</div></td>'
            f'<td data-l="Attempt" class="nowrap">{attempt} of {job.max_attempts}</td>'
            f'<td data-l="Last error">{error}</td></tr>'
        )
    if not rows:
        return "<p>No job yet.</p>"
    return (
        "<table><thead><tr><th>Job</th><th>Net</th><th>State</th><th>History (UTC)</th>"
        f"<th>Attempt</th><th>Last error</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def render(ov: Overview, refresh_s: int = REFRESH_S) -> str:
    """The whole page."""
    counts = ", ".join(f"{n} {escape(state)}" for state, n in sorted(ov.nets_by_state.items()))
    oldest = (
        f" (oldest waiting {duration((ov.now - ov.oldest_queued_at).total_seconds())})"
        if ov.oldest_queued_at
        else ""
    )
    title = f"net {escape(ov.net_filter)}" if ov.net_filter else "nets"
    back = ' \u00b7 <a href="nets">all nets</a>' if ov.net_filter else ""
    legend = "".join(f'<span><i class="k-{kind}"></i>{_LEGEND[kind]}</span>' for kind in KINDS)
    cards = "".join(_net_card(panel, ov) for panel in ov.nets)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta http-equiv="refresh" content="{refresh_s}">'
        f"<title>fl-dispatcher \u00b7 {title}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>fl-dispatcher \u00b7 {title}</h1>"
        f'<span class="meta">{ov.now.strftime("%Y-%m-%d %H:%M:%S")} UTC \u00b7 '
        f"refreshes every {refresh_s} s{back}</span></header><main>"
        f'<div class="summary"><span class="chip"><b>{ov.total_nets:,} nets</b>: {counts}</span>'
        f'<span class="chip"><b>Queue</b>: {ov.queued} job(s){oldest}</span></div>'
        f"{_drain(ov)}{_attention(ov)}"
        f'<h2 class="section">Last 24 hours</h2><div class="legend">{legend}</div>'
        f'{_pager(ov)}<div class="nets">{cards}</div>{_pager(ov)}'
        f'<h2 class="section">Recent jobs</h2>{_jobs(ov)}'
        "</main><footer>Times are UTC. Timeline from net_events and job_events; "
        "hover a segment or a state for its times and reason.</footer></body></html>"
    )

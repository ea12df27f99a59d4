"""The `simulate` command's arguments: grace values, a cold-start profile and the nets a
trace is replayed on, each refused with a message that names what is wrong."""

from __future__ import annotations

import math

from app.sim.savings import PROFILES, check_nets
from app.sim.trace import Trace
from app.sim.workload import ColdStart


def parse_graces(text: str) -> tuple[float, ...]:
    """`0,60,300` -> (0.0, 60.0, 300.0); ValueError on a bad or negative value."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise ValueError(f"grace values must be seconds, comma-separated: {text!r}") from exc
    if not values or any(v < 0 or not math.isfinite(v) for v in values):
        raise ValueError(f"grace values must be seconds >= 0: {text!r}")
    return tuple(sorted(set(values)))


def parse_cold_start(text: str) -> ColdStart:
    """A profile name (local, fargate) or PROVISION,LOGIN,SITES[,STOP] in seconds."""
    if text in PROFILES:
        return PROFILES[text]
    try:
        parts = [float(v) for v in text.split(",")]
    except ValueError as exc:
        raise ValueError(f"cold start {text!r}: a profile ({', '.join(PROFILES)})") from exc
    if len(parts) not in (3, 4) or any(v < 0 or not math.isfinite(v) for v in parts):
        raise ValueError(f"cold start {text!r}: PROVISION,LOGIN,SITES[,STOP], seconds >= 0")
    return ColdStart("custom", *parts)


def parse_nets(text: str | None, trace: Trace) -> tuple[str, ...]:
    """--nets: a count (nets net-1..net-N) or names; default: the nets the trace names, else
    4. Every net a job names must be among them."""
    named = trace.nets_named()
    if text is None:
        nets = tuple(named) if named else tuple(f"net-{i}" for i in range(1, 5))
    elif text.strip().isdigit():
        count = int(text)
        if count < 1:
            raise ValueError("--nets: at least one net")
        nets = tuple(f"net-{i}" for i in range(1, count + 1))
    else:
        nets = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        if not nets:
            raise ValueError("--nets: name at least one net")
    check_nets(trace, nets)
    return nets

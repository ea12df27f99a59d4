"""The argparse types of `fl-dispatcher`'s options: a value no command can use (inf, nan, a
negative wait, port 99999, -1 processes) is argparse's error line and exit 2 before anything
starts, never a traceback later (an OverflowError out of a thread's wait, Celery's own
option parser) nor a run that fails after its first minute (`demo`'s sleep)."""

from __future__ import annotations

import argparse
import math
import uuid
from typing import Any

from app.net_config import MAX_SECONDS
from app.payload_json import loads_payload

JOBS_LIMIT_MAX = 1_000_000  # what a query's LIMIT takes on both databases, and then some
MAX_PORT = 65535
# Processes or parallel replays on one machine: far above any machine's, far below what
# would fork it to death.
COUNT_MAX = 1024
# A synthetic trace's length: a century of FLIP's load is still a trace one can replay.
DAYS_MAX = 36_500.0


def job_id(raw: str) -> uuid.UUID:
    """A job id (a UUID)."""
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a job id (a UUID)") from None


def _whole(raw: str, low: int, high: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{value} is not within {low}..{high}")
    return value


def _number(raw: str, low: float, high: float, *, zero: bool, unit: str = "seconds") -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    above_low = low <= value if zero else low < value
    if not math.isfinite(value) or not above_low or value > high:
        least = f">= {low:g}" if zero else f"> {low:g}"
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a finite number of {unit} {least} and <= {high:,.0f}"
        )
    return value


def jobs_limit(raw: str) -> int:
    """`jobs --limit`: 1..JOBS_LIMIT_MAX."""
    return _whole(raw, 1, JOBS_LIMIT_MAX)


def port(raw: str) -> int:
    """A TCP port to listen on: 1..65535."""
    return _whole(raw, 1, MAX_PORT)


def count(raw: str) -> int:
    """How many processes (or replays at a time): 1..COUNT_MAX."""
    return _whole(raw, 1, COUNT_MAX)


SITES_MAX = 64  # a local net's sites, each a process of its own on this host


def sites(raw: str) -> int:
    """`local-net --sites`: 1..SITES_MAX."""
    return _whole(raw, 1, SITES_MAX)


def seconds(raw: str) -> float:
    """A deadline or an age: finite, > 0, at most MAX_SECONDS (what a thread's wait and a
    time in the database can hold)."""
    return _number(raw, 0.0, MAX_SECONDS, zero=False)


def seconds_or_zero(raw: str) -> float:
    """A wait or a pause that may be none: finite, >= 0, at most MAX_SECONDS."""
    return _number(raw, 0.0, MAX_SECONDS, zero=True)


def days(raw: str) -> float:
    """A synthetic trace's length: finite, > 0, at most DAYS_MAX."""
    return _number(raw, 0.0, DAYS_MAX, zero=False, unit="days")


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (--metadata)."""
    try:
        value = loads_payload(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object ({...})")
    return value


def graces(text: str) -> tuple[float, ...]:
    """simulate's idle graces."""
    from app.sim.savings_args import parse_graces  # the simulator loads only for `simulate`

    return parse_graces(text)


def cold_start(text: str) -> Any:
    """simulate's cold-start figures."""
    from app.sim.savings_args import parse_cold_start

    return parse_cold_start(text)

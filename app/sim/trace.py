"""Workload traces for `fl-dispatcher simulate`: reading and checking a trace file (CSV or
JSON lines), writing one, and generating a synthetic one shaped like FLIP's measured load.

A trace is one job a line: when it was submitted, how long it ran, the net it asked for (or
none), the sites it needs, its priority and, for a job flip-api hinted with a prewarm, how
long before its submission the hint was sent. Every problem is reported as `file:line: what is
wrong`, all of them at once, so a bad trace is fixed in one pass.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

FIELDS = ("submitted_at", "duration_s", "net", "required_sites", "priority", "hint_lead_s")
DEFAULT_SITES = ("site-1", "site-2")
MAX_ERRORS = 20  # a trace with more is reported by its first ones
# FLIP's measured load: its fl-servers were busy 16.4 h of 70.2 h.
FLIP_UTILIZATION = 16.4 / 70.2
# The longest hint a prewarm may carry (app.schemas.PREWARM_WITHIN_MAX_S, not imported: this
# module loads with the standard library only, for the CLI's parser).
MAX_HINT_LEAD_S = 86400.0


class TraceError(ValueError):
    """A trace that cannot be replayed: one `file:line: what is wrong` per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace (seconds from the trace's start)."""

    submitted_at: float
    duration_s: float
    net: str | None = None
    required_sites: tuple[str, ...] = DEFAULT_SITES
    priority: int = 0
    line: int = 0  # where it was read (0: not read from a file)
    # flip-api sent a prewarm hint this many seconds before submitting the job (None: none)
    hint_lead_s: float | None = None

    @property
    def hinted_at(self) -> float | None:
        """When the prewarm hint was sent (None: not hinted)."""
        return None if self.hint_lead_s is None else self.submitted_at - self.hint_lead_s


@dataclass(frozen=True)
class Trace:
    """Jobs in submission order."""

    jobs: tuple[TraceJob, ...]
    source: str = "trace"

    @property
    def horizon_s(self) -> float:
        """The span an always-on fleet pays for: trace start to the last job's end."""
        return max((j.submitted_at + j.duration_s for j in self.jobs), default=0.0)

    def busy_s(self) -> float:
        """Server-seconds the jobs themselves need."""
        return sum(j.duration_s for j in self.jobs)

    def utilization(self, nets: int) -> float:
        """Busy share of `nets` always-on servers over the horizon."""
        horizon = self.horizon_s
        return self.busy_s() / (nets * horizon) if horizon > 0 and nets > 0 else 0.0

    def nets_named(self) -> list[str]:
        """The nets the jobs ask for by name, in order of first mention."""
        return list(dict.fromkeys(j.net for j in self.jobs if j.net is not None))

    def sites(self) -> tuple[str, ...]:
        """Every site any job needs (each simulated net has them all)."""
        return tuple(sorted({s for j in self.jobs for s in j.required_sites}))

    def hinted(self) -> int:
        """How many jobs carry a prewarm hint."""
        return sum(j.hint_lead_s is not None for j in self.jobs)

    def without_hints(self) -> Trace:
        """The same jobs, none hinted."""
        return Trace(
            tuple(dataclasses.replace(j, hint_lead_s=None) for j in self.jobs), self.source
        )


# --- reading ---------------------------------------------------------------------------------


def read_trace(path: Path) -> Trace:
    """Read and check a trace file (CSV with a header row, or JSON lines); TraceError names
    every bad line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    return parse_trace(text, str(path))


def parse_trace(text: str, name: str = "trace") -> Trace:
    """A trace from its text: JSON lines if the first line that is not blank or a `#`
    comment starts with `{`, else CSV."""
    first = next((ln.strip() for ln in text.splitlines() if _content(ln)), "")
    rows = _json_rows(text, name) if first.startswith("{") else _csv_rows(text, name)
    problems: list[str] = []
    jobs: list[TraceJob] = []
    kinds: set[str] = set()
    for line, row in rows:
        if isinstance(row, str):
            problems.append(f"{name}:{line}: {row}")
            continue
        job, kind, errors = _job(row, line)
        problems += [f"{name}:{line}: {e}" for e in errors]
        if job is not None:
            if kinds and kind not in kinds:
                problems.append(
                    f"{name}:{line}: submitted_at: {kind} while earlier lines use "
                    f"{next(iter(kinds))} (use one kind throughout)"
                )
            kinds.add(kind)
            jobs.append(job)
        if len(problems) >= MAX_ERRORS:
            problems.append(f"{name}: stopped after {MAX_ERRORS} problems")
            break
    if not problems and not jobs:
        problems.append(f"{name}: no jobs in the trace")
    if problems:
        raise TraceError(problems)
    # Timestamps count from the first moment the trace shows: a submission, or a hint sent
    # before it.
    start = (
        min(j.submitted_at - (j.hint_lead_s or 0.0) for j in jobs)
        if kinds == {"a timestamp"}
        else 0.0
    )
    ordered = sorted(jobs, key=lambda j: (j.submitted_at, j.line))
    return Trace(
        tuple(dataclasses.replace(j, submitted_at=j.submitted_at - start) for j in ordered),
        source=name,
    )


def _content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


Row = dict[str, object] | str  # a row's fields, or why the line could not be split


def _json_rows(text: str, name: str) -> list[tuple[int, Row]]:
    rows: list[tuple[int, Row]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not _content(line):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            rows.append((number, f"not valid JSON: {exc.msg} (column {exc.colno})"))
            continue
        if not isinstance(value, dict):
            rows.append((number, "not a JSON object"))
            continue
        rows.append((number, value))
    return rows


def _csv_rows(text: str, name: str) -> list[tuple[int, Row]]:
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), start=1) if _content(ln)]
    if not lines:
        return []
    header_line, header_text = lines[0]
    header = [h.strip() for h in next(csv.reader([header_text]))]
    rows: list[tuple[int, Row]] = []
    missing = [f for f in ("submitted_at", "duration_s") if f not in header]
    unknown = [h for h in header if h not in FIELDS]
    if missing or unknown:
        what = []
        if missing:
            what.append(f"missing column(s) {', '.join(missing)}")
        if unknown:
            what.append(f"unknown column(s) {', '.join(unknown)}")
        return [(header_line, f"header: {'; '.join(what)} (columns: {', '.join(FIELDS)})")]
    for number, line in lines[1:]:
        cells = next(csv.reader(io.StringIO(line)))
        if len(cells) != len(header):
            rows.append((number, f"{len(cells)} fields, the header has {len(header)}"))
            continue
        row: dict[str, object] = {}
        for key, raw in zip(header, cells, strict=True):
            cell = raw.strip()
            if key == "required_sites":
                row[key] = [s for s in cell.replace(";", " ").split() if s] if cell else None
            else:
                row[key] = cell if cell and cell.lower() != "null" else None
        rows.append((number, row))
    return rows


def _job(row: dict[str, object], line: int) -> tuple[TraceJob | None, str, list[str]]:
    """A row's job, the kind of its submitted_at, and what is wrong with it."""
    errors = [f"unknown field {k!r} (fields: {', '.join(FIELDS)})" for k in row if k not in FIELDS]
    submitted, kind = _submitted(row.get("submitted_at"), errors)
    duration = _number(row.get("duration_s"), "duration_s", errors)
    if duration is not None and duration <= 0:
        errors.append(f"duration_s: {duration:g} must be > 0")
    net = row.get("net")
    if net is not None and (not isinstance(net, str) or not net.strip()):
        errors.append(f"net: {net!r} must be a net's name or null")
    sites = _sites(row.get("required_sites"), errors)
    priority = _priority(row.get("priority"), errors)
    lead = _hint_lead(row.get("hint_lead_s"), submitted, kind, errors)
    if errors or submitted is None or duration is None:
        return None, kind, errors
    net_name = net.strip() if isinstance(net, str) else None
    job = TraceJob(submitted, duration, net_name, sites, priority, line, hint_lead_s=lead)
    return job, kind, errors


def _submitted(value: object, errors: list[str]) -> tuple[float | None, str]:
    if value is None:
        errors.append("submitted_at: missing")
        return None, "seconds"
    if isinstance(value, str):
        try:
            return float(value), _check_seconds(float(value), errors)
        except ValueError:
            pass
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError:
            errors.append(f"submitted_at: {value!r} is neither seconds nor an ISO 8601 time")
            return None, "seconds"
        if stamp.tzinfo is None:
            errors.append(f"submitted_at: {value!r} has no time zone (add Z or +00:00)")
            return None, "a timestamp"
        return stamp.timestamp(), "a timestamp"
    if isinstance(value, bool) or not isinstance(value, int | float):
        errors.append(f"submitted_at: {value!r} is neither seconds nor an ISO 8601 time")
        return None, "seconds"
    return float(value), _check_seconds(float(value), errors)


def _check_seconds(value: float, errors: list[str]) -> str:
    if not math.isfinite(value) or value < 0:
        errors.append(f"submitted_at: {value:g} must be seconds >= 0")
    return "seconds"


def _number(value: object, field: str, errors: list[str]) -> float | None:
    if value is None:
        errors.append(f"{field}: missing")
        return None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            errors.append(f"{field}: {value!r} is not a number")
            return None
    elif isinstance(value, bool) or not isinstance(value, int | float):
        errors.append(f"{field}: {value!r} is not a number")
        return None
    else:
        number = float(value)
    if not math.isfinite(number):
        errors.append(f"{field}: {value!r} is not a finite number")
        return None
    return number


def _sites(value: object, errors: list[str]) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_SITES
    if not isinstance(value, list) or not all(isinstance(s, str) and s.strip() for s in value):
        errors.append(f"required_sites: {value!r} must be a list of site names")
        return DEFAULT_SITES
    if not value:
        errors.append("required_sites: empty (name at least one site, or leave it out)")
        return DEFAULT_SITES
    return tuple(s.strip() for s in value)


def _hint_lead(
    value: object, submitted: float | None, kind: str, errors: list[str]
) -> float | None:
    """hint_lead_s: absent (no hint), or seconds >= 0 before the submission; in seconds
    from the trace's start, the hint cannot come before that start."""
    if value is None:
        return None
    lead = _number(value, "hint_lead_s", errors)
    if lead is None:
        return None
    if lead < 0:
        errors.append(f"hint_lead_s: {lead:g} must be seconds >= 0 (or empty for no hint)")
        return None
    if lead > MAX_HINT_LEAD_S:
        errors.append(
            f"hint_lead_s: {lead:g} is over {MAX_HINT_LEAD_S:g}, the longest hint a prewarm"
            " may carry"
        )
        return None
    if kind == "seconds" and submitted is not None and submitted >= 0 and lead > submitted:
        errors.append(
            f"hint_lead_s: {lead:g} puts the hint before the trace's start (submitted_at"
            f" {submitted:g})"
        )
        return None
    return lead


def _priority(value: object, errors: list[str]) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            errors.append(f"priority: {value!r} is not an integer")
            return 0
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(f"priority: {value!r} is not an integer")
        return 0
    return value


# --- writing ---------------------------------------------------------------------------------


def write_trace(trace: Trace, path: Path) -> None:
    """Write a trace as JSON lines (`.jsonl`, `.json`) or CSV (anything else)."""
    path.write_text(format_trace(trace, jsonl=path.suffix in (".jsonl", ".json")))


def format_trace(trace: Trace, *, jsonl: bool = False) -> str:
    """The trace file's text (read back by `parse_trace` to the same jobs). A hint is
    written only where there is one (JSON: the key on hinted jobs; CSV: the column when any
    job is hinted), so a trace without hints is written as before hints existed."""
    if jsonl:
        return "".join(json.dumps(_json_job(j)) + "\n" for j in trace.jobs)
    hinted = trace.hinted() > 0
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS if hinted else FIELDS[:-1])
    for j in trace.jobs:
        cells: list[object] = [
            f"{j.submitted_at:.3f}",
            f"{j.duration_s:.3f}",
            j.net or "",
            ";".join(j.required_sites),
            j.priority,
        ]
        if hinted:
            cells.append("" if j.hint_lead_s is None else f"{j.hint_lead_s:.3f}")
        writer.writerow(cells)
    return out.getvalue()


def _json_job(job: TraceJob) -> dict[str, object]:
    row: dict[str, object] = {
        "submitted_at": round(job.submitted_at, 3),
        "duration_s": round(job.duration_s, 3),
        "net": job.net,
        "required_sites": list(job.required_sites),
        "priority": job.priority,
    }
    if job.hint_lead_s is not None:
        row["hint_lead_s"] = round(job.hint_lead_s, 3)
    return row


# --- a synthetic trace -------------------------------------------------------------------------


@dataclass(frozen=True)
class Synthetic:
    """What a synthetic trace looks like. The defaults: a month on 4 nets at FLIP's measured
    utilization, each day a few multi-hour jobs and bursts of short ones (about 1,000 jobs)."""

    seed: int = 0
    days: float = 30.0
    nets: int = 4
    utilization: float = FLIP_UTILIZATION
    long_per_day: float = 3.0  # multi-hour jobs a day (Poisson)
    long_median_h: float = 3.0  # their length: lognormal around this median
    bursts_per_day: float = 4.0  # bursts of short jobs a day (Poisson)
    burst_jobs: tuple[int, int] = (4, 12)  # jobs in a burst (uniform)
    burst_gap_s: float = 120.0  # mean gap between a burst's submissions (exponential)
    short_median_min: float = 8.0  # a short job's length: lognormal around this median
    # The share of jobs flip-api hints with a prewarm, and how long before it submits them
    # (a user opening a model's training page a couple of minutes before starting it).
    hinted: float = 0.0
    hint_lead_s: float = 120.0

    def check(self) -> None:
        """ValueError on settings no trace can have."""
        if self.days <= 0 or self.nets < 1:
            raise ValueError("days must be > 0 and nets >= 1")
        if not 0 < self.utilization < 1:
            raise ValueError(f"utilization {self.utilization} must be between 0 and 1")
        if self.long_per_day < 0 or self.bursts_per_day < 0:
            raise ValueError("jobs per day must be >= 0")
        low, high = self.burst_jobs
        if not 1 <= low <= high:
            raise ValueError(f"burst_jobs {self.burst_jobs}: need 1 <= low <= high")
        if not 0 <= self.hinted <= 1:
            raise ValueError(f"hinted share {self.hinted} must be between 0 and 1")
        if not 0 <= self.hint_lead_s <= MAX_HINT_LEAD_S:
            raise ValueError(
                f"hint lead {self.hint_lead_s} must be seconds between 0 and {MAX_HINT_LEAD_S:g}"
            )


def synthesize(spec: Synthetic) -> Trace:
    """A seeded synthetic trace (the same spec gives the same trace): arrivals and lengths
    drawn as `spec` says, then every length scaled by one factor so that the jobs fill
    `spec.utilization` of `spec.nets` servers over `spec.days`."""
    spec.check()
    rng = random.Random(f"synthetic/{spec.seed}")
    horizon = spec.days * 86400.0
    drafts: list[tuple[float, float]] = []
    day = 0.0
    while day < horizon:
        span = min(86400.0, horizon - day)
        share = span / 86400.0
        for _ in range(_poisson(rng, spec.long_per_day * share)):
            length = rng.lognormvariate(math.log(spec.long_median_h * 3600), 0.45)
            drafts.append((day + rng.uniform(0, span), length))
        for _ in range(_poisson(rng, spec.bursts_per_day * share)):
            at = day + rng.uniform(0, span)
            for _ in range(rng.randint(*spec.burst_jobs)):
                length = rng.lognormvariate(math.log(spec.short_median_min * 60), 0.6)
                drafts.append((at, length))
                at += rng.expovariate(1.0 / spec.burst_gap_s)
        day += 86400.0
    if not drafts:
        raise ValueError("these settings drew no job: raise the jobs per day or the days")
    factor = spec.utilization * spec.nets * horizon / sum(length for _, length in drafts)
    jobs = []
    for at, length in drafts:
        duration = min(length * factor, horizon)
        # A job still running at the end is moved earlier, so the trace spans `days` exactly.
        start = min(at, horizon - duration)
        jobs.append(TraceJob(round(start, 3), round(duration, 3)))
    jobs.sort(key=lambda j: j.submitted_at)
    if spec.hinted <= 0:
        return Trace(tuple(jobs), source=f"synthetic(seed={spec.seed})")
    hints = f"{spec.hinted:g} hinted {spec.hint_lead_s:g}s ahead"
    return Trace(tuple(_hint(jobs, spec)), source=f"synthetic(seed={spec.seed}, {hints})")


def _hint(jobs: list[TraceJob], spec: Synthetic) -> list[TraceJob]:
    """Each job hinted with probability `spec.hinted`, from a stream of its own, so the jobs
    are those of the same seed without hints (a job submitted sooner than the lead after the
    trace's start is hinted at that start)."""
    rng = random.Random(f"synthetic/{spec.seed}/hints")
    return [
        dataclasses.replace(j, hint_lead_s=min(spec.hint_lead_s, j.submitted_at))
        if rng.random() < spec.hinted
        else j
        for j in jobs
    ]


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's method; the means here are small)."""
    if mean <= 0:
        return 0
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def describe(jobs: Iterable[TraceJob]) -> str:
    """`N jobs, X h of work` (for messages)."""
    items = list(jobs)
    return f"{len(items)} jobs, {sum(j.duration_s for j in items) / 3600:.1f} h of work"

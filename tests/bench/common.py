"""What the benchmarks share: a throw-away PostgreSQL database built by migrations, settings
for many nets, statement counting, and the table/JSON report.

Benchmarks are not tests: pytest never collects this package (files are `bench_*.py`), and
nothing here asserts a duration. Each benchmark is one command, e.g.
`.venv/bin/python -m tests.bench.bench_beat_tick --nets 10,100,1000 [--json]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from app import migrate
from tests.fixtures.db import fresh_pg_database


@contextmanager
def pg_database(prefix: str = "fld_bench") -> Iterator[str]:
    """A fresh PostgreSQL database at migration head (dropped afterwards)."""
    with fresh_pg_database(prefix) as url:
        migrate.upgrade(url)
        yield url


def nets_json(kit_dir: Path, names: Sequence[str], driver: Callable[[str], dict[str, Any]]) -> str:
    """NETS for Settings: every net shares one admin kit folder (validation only reads it)."""
    (kit_dir / "startup").mkdir(parents=True, exist_ok=True)
    (kit_dir / "startup" / "fed_admin.json").write_text("{}")
    return json.dumps(
        [
            {
                "name": name,
                "driver": driver(name),
                "admin": {"kit_dir": str(kit_dir), "username": "admin"},
                "required_sites": ["site-1", "site-2"],
            }
            for name in names
        ]
    )


@dataclass
class StatementCounter:
    """Counts SQL statements and transactions an engine runs (the shape of a cost)."""

    statements: int = 0
    commits: int = 0

    def attach(self, engine: Engine) -> StatementCounter:
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)
        return self

    def _statement(self, *_: Any) -> None:
        self.statements += 1

    def _commit(self, *_: Any) -> None:
        self.commits += 1

    def reset(self) -> None:
        self.statements = self.commits = 0


@dataclass
class StatementProfile:
    """Time per SQL statement shape (literals differ, the text does not): where a loop's
    database time goes, and how many round trips it makes."""

    by_sql: dict[str, list[float]] = field(default_factory=dict)
    _started: list[float] = field(default_factory=list)

    def attach(self, engine: Engine) -> StatementProfile:
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        return self

    def detach(self, engine: Engine) -> None:
        event.remove(engine, "before_cursor_execute", self._before)
        event.remove(engine, "after_cursor_execute", self._after)

    def _before(self, *_: Any) -> None:
        self._started.append(time.perf_counter())

    def _after(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        elapsed = (time.perf_counter() - self._started.pop()) * 1000
        self.by_sql.setdefault(" ".join(statement.split()), []).append(elapsed)

    def top(self, n: int = 6, width: int = 150) -> list[tuple[int, float, str]]:
        """(count, total ms, statement) for the n most expensive shapes."""
        rows = [(len(v), sum(v), sql[:width]) for sql, v in self.by_sql.items()]
        return sorted(rows, key=lambda r: -r[1])[:n]


@dataclass
class Timing:
    """Repeated measurements of one thing, in milliseconds."""

    samples_ms: list[float] = field(default_factory=list)

    def measure(self, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = fn()
        self.samples_ms.append((time.perf_counter() - start) * 1000)
        return result

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")


def ratio(value: float, goal: float) -> str:
    """How far a figure is from its goal: 0.40x is inside, 3.10x is three times over."""
    return f"{value / goal:.2f}x"


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain fixed-width table."""
    cells = [list(header)] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(title)
    for i, row in enumerate(cells):
        print(
            "  "
            + "  ".join(
                c.rjust(w) if j else c.ljust(w)
                for j, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def int_list(text: str) -> list[int]:
    """`10,100,1000` or `10k,100k` -> [10, 100, 1000]."""
    values = []
    for raw in text.split(","):
        part = raw.strip().lower().replace("_", "")
        scale = 1_000_000 if part.endswith("m") else 1000 if part.endswith("k") else 1
        values.append(int(float(part.rstrip("km")) * scale))
    return values


def common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return parser


def environment() -> dict[str, str]:
    """Where the figures came from (commit, Python, CPU count)."""
    import os

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"commit": commit, "python": sys.version.split()[0], "cpus": str(os.cpu_count())}

"""Writes tests/mutation/REPORT.md from the results of the last `mutmut run` (in mutants/).

Run by tests/mutation/run.sh after mutmut; alone: `.venv/bin/python -m tests.mutation.report`.
Score = killed / (killed + survived + no tests), per file and overall; a timeout counts as
killed (the mutant made the tests hang, which a run notices). Every survivor is listed with
its diff, so what a new test should catch (or what to mark `# pragma: no mutate`) is visible
without `mutmut browse`.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "tests" / "mutation" / "REPORT.md"

# mutmut 3's exit codes per mutant (mutmut/stats.py), folded into the columns of the report.
KILLED_CODES = {1, 3, 36, -24, 24, 152, 255, 37}  # failed tests, timeouts, type check
TYPE_CHECK_CODE = 37  # mypy rejected the mutant, so no test ran (pyproject's type_check_command)
SURVIVED_CODES = {0}
NO_TESTS_CODES = {5, 33}


@dataclass
class FileResult:
    path: str
    killed: int = 0
    by_mypy: int = 0  # of the killed
    survived: list[str] = field(default_factory=list)
    no_tests: list[str] = field(default_factory=list)
    other: Counter[str] = field(default_factory=Counter)

    @property
    def scored(self) -> int:
        return self.killed + len(self.survived) + len(self.no_tests)

    @property
    def score(self) -> float:
        return 100.0 * self.killed / self.scored if self.scored else 100.0


def mutated_files() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


def read_results(path: str) -> FileResult:
    result = FileResult(path)
    meta = ROOT / "mutants" / f"{path}.meta"
    if not meta.exists():
        result.other["not run"] += 1
        return result
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    for name, code in sorted(codes.items()):
        if code in KILLED_CODES:
            result.killed += 1
            result.by_mypy += code == TYPE_CHECK_CODE
        elif code in SURVIVED_CODES:
            result.survived.append(name)
        elif code in NO_TESTS_CODES:
            result.no_tests.append(name)
        else:
            result.other["not checked" if code is None else f"exit {code}"] += 1
    return result


def mutant_diff(path: str, name: str) -> str:
    """The mutant's diff as `mutmut show` prints it (read in this process: one `mutmut show`
    per survivor would start a Python each), without the file header lines."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    shown = get_diff_for_mutant(name, path=path)
    lines = [
        line
        for line in shown.splitlines()
        if line.startswith(("-", "+", "@")) and not line.startswith(("---", "+++"))
    ]
    return "\n".join(lines)


def render(results: list[FileResult], with_diffs: bool) -> str:
    total = FileResult("total")
    for r in results:
        total.killed += r.killed
        total.by_mypy += r.by_mypy
        total.survived += r.survived
        total.no_tests += r.no_tests
        total.other += r.other
    out = [
        "# Mutation testing report",
        "",
        "Written by `bash tests/mutation/run.sh` (tests/README.md, Mutation testing); do not edit.",
        "Score = killed / (killed + survived + no tests); timeouts count as killed, and so do",
        "mutants mypy rejects (the test command runs mypy, so they cannot land); the column",
        "By mypy says how many of the killed those are.",
        "",
        "| File | Mutants | Killed | By mypy | Survived | No tests | Not checked | Score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in [*results, total]:
        name = f"**{r.path}**" if r is total else f"`{r.path}`"
        score = f"{r.score:.1f}%" if r.scored else "-"
        out.append(
            f"| {name} | {r.scored + sum(r.other.values())} | {r.killed} | {r.by_mypy} "
            f"| {len(r.survived)} "
            f"| {len(r.no_tests)} | {sum(r.other.values())} | {score} |"
        )
    if total.other:
        out += [
            "",
            "Not checked (the run was stopped before them; the score is over the checked "
            "ones): " + ", ".join(f"{n} {k}" for k, n in sorted(total.other.items())),
        ]
    last_run = ROOT / "mutants" / "last-full-run.txt"
    if last_run.exists():
        out += ["", f"Last run from scratch: {last_run.read_text().strip()}."]
    out += ["", "## Survivors", ""]
    if not (total.survived or total.no_tests):
        out.append("None: every mutant is killed or marked `# pragma: no mutate` with a reason.")
    for r in results:
        for label, names in (("survived", r.survived), ("no tests", r.no_tests)):
            for name in names:
                out.append(f"- `{name}` ({label})")
                diff = mutant_diff(r.path, name) if with_diffs else ""
                if diff:
                    out += ["", "  ```diff", *(f"  {line}" for line in diff.splitlines()), "  ```"]
    return "\n".join(out) + "\n"


def main() -> None:
    os.chdir(ROOT)  # mutmut reads pyproject.toml and mutants/ from the current folder
    results = [read_results(path) for path in mutated_files()]
    REPORT.write_text(render(results, with_diffs="--no-diffs" not in sys.argv))
    print(f"wrote {REPORT.relative_to(ROOT)}")
    for r in results:
        unchecked = sum(r.other.values())
        print(f"  {r.path}: {r.score:.1f}% ({r.killed}/{r.scored}; {unchecked} not checked)")


if __name__ == "__main__":
    main()

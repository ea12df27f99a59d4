"""The test command's closing report, from the JUnit files of its phases: each tier's count
and summed test time, the 15 slowest tests, and one closing line for the whole run.

    python -m tests.tools.test_report unit.xml others.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

SLOWEST = 15


@dataclass(frozen=True)
class Case:
    """One test's outcome as a JUnit file records it."""

    name: str
    tier: str
    seconds: float
    outcome: str  # passed | failed | skipped


def tier_of(classname: str) -> str:
    """tests.unit.test_x -> unit (the folder is the tier)."""
    parts = classname.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def read(path: Path) -> list[Case]:
    """Every test case in one JUnit file."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        name = f"{classname.replace('.', '/')}.py::{case.get('name')}"
        cases.append(Case(name, tier_of(classname), float(case.get("time", 0) or 0), outcome))
    return cases


def report(cases: list[Case]) -> str:
    """The closing report's text."""
    lines = ["== tiers (tests, summed test time; phases run in parallel workers)"]
    by_tier: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        by_tier[case.tier].append(case)
    for tier in sorted(by_tier):
        tier_cases = by_tier[tier]
        total = sum(c.seconds for c in tier_cases)
        lines.append(f"{tier:>12}: {len(tier_cases):5d} tests, {total:7.1f} s")
    lines.append(f"== the {SLOWEST} slowest tests")
    for case in sorted(cases, key=lambda c: -c.seconds)[:SLOWEST]:
        lines.append(f"{case.seconds:8.1f} s  {case.name}")
    counts = Counter(c.outcome for c in cases)
    closing = f"total: {counts['passed']} passed, {counts['failed']} failed"
    if counts["skipped"]:
        closing += f", {counts['skipped']} skipped"
    lines.append(closing)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Print the report of the JUnit files named (missing ones are a phase that did not run)."""
    cases = [case for arg in argv if Path(arg).is_file() for case in read(Path(arg))]
    print(report(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What a simulation reports: each broken invariant (a `Violation`), and one seed's
`Result` with the one-line command that replays it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which, when (simulated seconds), about what, and details."""

    invariant: str
    t: float
    subject: str
    detail: str

    def line(self) -> str:
        return f"[{self.invariant}] t={self.t:.1f}s {self.subject}: {self.detail}"


def replay_command(seed: int) -> str:
    return f"SIM_SEED={seed} .venv/bin/python -m pytest tests/unit/test_simulation.py -k replay -s"


@dataclass
class Result:
    """What one simulation found."""

    seed: int
    profile: str
    violations: list[Violation]
    stats: dict[str, int | float]
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        head = f"seed {self.seed} (profile {self.profile})"
        if self.ok:
            return f"{head}: ok"
        lines = [f"{head}: {len(self.violations)} violation(s)"]
        lines += [f"  {v.line()}" for v in self.violations]
        lines.append(f"  replay: {replay_command(self.seed)}")
        return "\n".join(lines)

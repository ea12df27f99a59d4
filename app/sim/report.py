"""What a simulation reports: each broken invariant (a `Violation`), and its `Result`
(with, for a seed of the sweep, the one-line command that replays it)."""

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


@dataclass
class Result:
    """What one simulation found."""

    seed: int
    profile: str
    violations: list[Violation]
    stats: dict[str, int | float]
    trace: list[str] = field(default_factory=list)
    replay: str | None = None  # how to replay it, where the caller knows (the sweep's seeds)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        head = f"seed {self.seed} (profile {self.profile})"
        if self.ok:
            return f"{head}: ok"
        lines = [f"{head}: {len(self.violations)} violation(s)"]
        lines += [f"  {v.line()}" for v in self.violations]
        if self.replay is not None:
            lines.append(f"  replay: {self.replay}")
        return "\n".join(lines)

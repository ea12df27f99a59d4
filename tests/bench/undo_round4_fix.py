"""Undo one of round 4's fixes (issue 36) in a copy of the tree and ask the sweep whether it
finds that defect (tests/sim/README.md, "Each fix of round 4"): the copy's seeds A..B
are run (their own profiles, or `--profile P` on every seed), and a seed counts only if it
reports an invariant the same seed does not report on this tree, with every fix in.

    .venv/bin/python -m tests.bench.undo_round4_fix 19 0:300
    .venv/bin/python -m tests.bench.undo_round4_fix 21 0:300 --profile crashy

prints the first such seed and its violations, then every finding seed. Each edit reverses
the core of one fix as today's code holds it; the copy is thrown away afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("app", "models", "migrations", "tasks", "tests/__init__.py", "tests/sim")

# fix -> [(file, the fixed code, the code before the fix)]
EDITS: dict[str, list[tuple[str, str, str]]] = {
    "9": [  # reconcile's READY of a job-less STARTING net idles from its holds' end
        (
            "app/usecases/prewarm/warm_up.py",
            "        idle_since = idle_from_holds(session, net_name, net.state_changed_at, now)\n",
            "        idle_since = (\n"
            "            now  # reconcile's READY (its reason), before the fix\n"
            '            if reason == "up, no job: idle"\n'
            "            else idle_from_holds(session, net_name, net.state_changed_at, now)\n"
            "        )\n",
        ),
    ],
    "11": [  # an identical retry after a redeploy is the same request
        (
            "app/usecases/enqueue.py",
            "    as_sent = existing.sent_digest is not None and existing.sent_digest == "
            "request.sent_digest()\n",
            "    as_sent = False  # the stored digest against today's defaults alone\n",
        ),
    ],
    "19": [  # reconcile makes a job-less STARTING net READY only once its server is ready
        (
            "app/usecases/net_repairs.py",
            "            note = _ready_once_ready(rt, name, age_s)\n"
            "            if note is not None:\n"
            "                return note\n",
            '            _set_net_state(rt, name, NetState.STARTING, NetState.READY, "up, no job: '
            'idle")\n'
            '            return "STARTING without a job: now READY (idle)"\n',
        ),
    ],
    "21": [  # step leases: a lapsed ASSIGNED job's chain is re-driven (only a submit had one)
        (
            "app/usecases/step_leases.py",
            "        if net_name is None or not rt.settings.has_net(net_name):\n",
            "        if state == JobState.ASSIGNED:\n"
            "            continue  # before the fix: no lease but a submit's\n"
            "        if net_name is None or not rt.settings.has_net(net_name):\n",
        ),
    ],
}

# Runs in a tree (cwd): the seeds' violations as JSON lines, seed by seed.
RUNNER = """
import json, sys
from tests.sim.profiles import PROFILES_BY_NAME
from tests.sim.sweep import run_seeds
seeds = json.loads(sys.argv[1]); profile = PROFILES_BY_NAME.get(sys.argv[2])
for r in run_seeds(seeds, profile, int(sys.argv[3]), fail_fast=True):
    print(json.dumps([r.seed, r.profile, [v.line() for v in r.violations]]), flush=True)
"""


def undo(fix: str, root: Path) -> None:
    """Apply fix `fix`'s reversal to the tree at `root` (fails if the code moved on)."""
    for relative, fixed, before in EDITS[fix]:
        path = root / relative
        text = path.read_text()
        if fixed not in text:
            raise SystemExit(f"fix {fix}: {relative} no longer holds the fixed code")
        path.write_text(text.replace(fixed, before, 1))


def copy_tree(into: Path) -> None:
    """What the sweep imports, copied from this tree (work in progress included)."""
    ignore = shutil.ignore_patterns("__pycache__")
    for relative in COPIED:
        source, target = ROOT / relative, into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        else:
            shutil.copy2(source, target)


def violations(tree: Path, seeds: list[int], profile: str, workers: int) -> dict[int, list[str]]:
    """Each seed's violation lines, run in `tree`."""
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(seeds), profile, str(workers)],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        seed, _profile, lines = json.loads(line)
        found[seed] = lines
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.undo_round4_fix")
    parser.add_argument("fix", choices=sorted(EDITS))
    parser.add_argument("seeds", help="A:B")
    parser.add_argument("--profile", default="-", help="force this profile on every seed")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    lo, hi = (int(x) for x in args.seeds.split(":"))
    seeds = list(range(lo, hi))
    with tempfile.TemporaryDirectory(prefix=f"undo4-{args.fix}-") as tmp:
        copy = Path(tmp)
        copy_tree(copy)
        undo(args.fix, copy)
        undone = violations(copy, seeds, args.profile, args.workers)
    failing = sorted(s for s, lines in undone.items() if lines)
    fixed = violations(ROOT, failing, args.profile, args.workers) if failing else {}
    found = []
    for seed in failing:
        before = {line.split("]")[0] for line in fixed.get(seed, [])}
        new = [line for line in undone[seed] if line.split("]")[0] not in before]
        if new:
            found.append((seed, new))
    forced = f" --profile {args.profile}" if args.profile != "-" else ""
    print(f"fix {args.fix} undone, seeds {lo}:{hi}{forced}: {len(found)} seed(s) find it")
    if found:
        seed, lines = found[0]
        print(f"first: seed {seed}: " + "\n  ".join(lines[:3]))
        print("seeds: " + ", ".join(f"{s} ({ls[0].split(']')[0][1:]})" for s, ls in found))


if __name__ == "__main__":
    main()

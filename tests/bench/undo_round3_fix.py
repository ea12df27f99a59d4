"""Undo one of round 3's eight fixes (871e7f6) in a copy of the tree, so the simulator's
sweep can be asked whether it finds that defect (tests/sim/README.md, "What the simulation
drives").
Each edit reverses the core of one fix; the copy is thrown away afterwards.

    git archive HEAD app models migrations tasks tests/__init__.py tests/sim | tar -x -C /tmp/undo5
    .venv/bin/python -m tests.bench.undo_round3_fix 5 /tmp/undo5
    cd /tmp/undo5 && /path/to/.venv/bin/python -m tests.sim 3     # this seed reports it
"""

from __future__ import annotations

import sys
from pathlib import Path

# fix -> [(file, the fixed code, the code before the fix)]
EDITS: dict[int, list[tuple[str, str, str]]] = {
    1: [  # a report on an ABORTING job keeps its run as a stray
        (
            "app/usecases/records.py",
            "if job.state in (JobState.RUNNING, JobState.ABORTING) and job.net_name is not None:",
            "if job.state == JobState.RUNNING and job.net_name is not None:",
        ),
        (
            "app/usecases/intake.py",
            "was_running = job.state in (JobState.RUNNING, JobState.ABORTING)",
            "was_running = job.state == JobState.RUNNING",
        ),
    ],
    2: [  # prepared copies keyed by what they are built from
        (
            "app/adapters/jobdefs.py",
            "/ PREPARED_DIR / str(job_id) / key / bundle.name",
            "/ PREPARED_DIR / str(job_id) / bundle.name",
        ),
        (  # and the sweep removes every copy of a job not active (QUEUED included)
            "app/usecases/reconciler.py",
            "select(Job.id).where(Job.id.in_(ids), Job.state.not_in(TERMINAL_JOB_STATES))",
            "select(Job.id).where(Job.id.in_(ids), Job.state.in_(ACTIVE_JOB_STATES))",
        ),
    ],
    3: [  # the console's placeholder for the job folder itself
        (
            "app/adapters/s3_bundles.py",
            'if relative == "" or (relative.endswith("/") and size == 0):',
            'if relative.endswith("/") and size == 0:',
        ),
    ],
    4: [  # idle scale-down counts only claimable QUEUED jobs
        (
            "app/usecases/claims.py",
            "    sites = select(Job.required_sites).where(\n        _claimable(), or_(",
            "    sites = select(Job.required_sites).where(\n"
            "        Job.state == JobState.QUEUED, or_(",
        ),
    ],
    5: [  # unstorable strings refused at enqueue; an unencodable event failed, not raised
        (
            "app/schemas.py",
            "        for name in type(self).model_fields:\n"
            "            _check_storable(getattr(self, name), name)\n"
            "        return self",
            "        return self",
        ),
        (
            "app/usecases/callbacks/payloads.py",
            "    except (UnicodeError, ValueError, TypeError) as exc:",
            "    except ZeroDivisionError as exc:",
        ),
    ],
    6: [  # the backoff's exponent clamped before computing
        (
            "app/usecases/callbacks/verdicts.py",
            "doublings = min(max(0, tries - 1), MAX_DOUBLINGS)",
            "doublings = max(0, tries - 1)",
        ),
    ],
    7: [  # reconcile settles work on nets NETS no longer declares
        (
            "app/usecases/reconciler.py",
            "redriven = settle_undeclared(rt) + _redrive_stuck_jobs(rt, now)",
            "redriven = _redrive_stuck_jobs(rt, now)",
        ),
    ],
    8: [  # a failure handler moves only the attempt its step was started for
        (
            "app/usecases/dispatch.py",
            "    if net_name is None or attempt is None:\n"
            "        return False\n"
            "    with unit_of_work(rt.sessions) as session:\n"
            "        job = services.get_job(session, job_id, lock=True)\n"
            "        if _ours(job, JobState.DISPATCHING, net_name, attempt):",
            "    with unit_of_work(rt.sessions) as session:\n"
            "        job = services.get_job(session, job_id, lock=True)\n"
            "        if job.state == JobState.DISPATCHING:",
        ),
        (
            "app/usecases/dispatch.py",
            "        if not _ours(job, JobState.ASSIGNED, net_name, attempt):\n",
            "        if False:\n",
        ),
    ],
}


def undo(fix: int, root: Path) -> None:
    """Apply fix `fix`'s reversal to the tree at `root` (fails if the code moved on)."""
    for relative, fixed, before in EDITS[fix]:
        path = root / relative
        text = path.read_text()
        if fixed not in text:
            raise SystemExit(f"fix {fix}: {relative} no longer holds the fixed code")
        path.write_text(text.replace(fixed, before, 1))


if __name__ == "__main__":
    undo(int(sys.argv[1]), Path(sys.argv[2]))
    print(f"fix {sys.argv[1]} undone in {sys.argv[2]}")

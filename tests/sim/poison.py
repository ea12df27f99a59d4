"""A poison row (FaultProfile.poison_row, racy and chaos): the database refuses every write
to one job's row for 30-100 s once the job is RUNNING, ABORTING or FINISHING (a temporary
trigger raising, as a row a constraint, a corrupt page or a bug in one code path refuses),
drawn on a stream of its own (`f"{seed}/poison"`: the other worlds run as before).

What it must not do: stop the work on any other row. A task about that job (flip-api's
call, a pipeline step, a per-net step) fails with it, as it would in production; a
housekeeping round over every net must handle the job on its own (`isolated`) and go on with
the others, so an escape from one is a `no-escape` finding, as ever. Its length stays under
the slack the racy and chaos bounds already give a paused worker."""

from __future__ import annotations

import random
from collections.abc import Callable

from app.schemas import job_id_for
from app.sim.simulation import Simulation

POISON = "sim: poison row"
# The tasks the poison may fail: each about one job, or one net (app.sim.messages kinds).
FAILS_WITH_IT = ("request", "pipeline", "plain")

_SCHEMA = """
CREATE TEMP TABLE sim_poison (job_id TEXT PRIMARY KEY);
CREATE TEMP TRIGGER sim_poison_refuses BEFORE UPDATE ON main.jobs
WHEN OLD.id IN (SELECT job_id FROM temp.sim_poison)
BEGIN
    SELECT RAISE(ABORT, 'sim: poison row: the database refuses this job''s row');
END;
"""
assert POISON in _SCHEMA  # the trigger's text is what `excused` looks for

# A job that reaches its state after the horizon (a report wait ends late) is still poisoned
# up to this long after it.
LATEST_AFTER_HORIZON_S = 120.0

Arm = Callable[[str, str, str, Callable[[], None]], None]


def schedule(sim: Simulation, arm: Arm) -> None:
    """Arm the profile's poison, if its stream draws one: one job, once it is in a state."""
    p = sim.profile.poison_row
    jobs = sim.workload.jobs
    rng = random.Random(f"{sim.seed}/poison")
    if not p or not jobs or rng.random() >= p:
        return
    job = rng.choice(jobs)
    # FINISHING (a finished run held for flip-api's report) only where runs are held.
    held = ("FINISHING", "FINISHING") if sim.world.release_after == "reported" else ()
    state = rng.choice(("RUNNING", "ABORTING", *held))
    length = rng.uniform(30.0, 100.0)
    job_hex = str(job_id_for(job.key)).replace("-", "")
    sim.conn.executescript(_SCHEMA)

    def clear() -> None:
        sim.conn.execute("DELETE FROM temp.sim_poison WHERE job_id = ?", (job_hex,))

    def start() -> None:
        if sim.clock.t > sim.workload.horizon_s + LATEST_AFTER_HORIZON_S:
            return  # (well within the human's fix after faults stop: the liveness bound)
        sim.conn.execute("INSERT INTO temp.sim_poison (job_id) VALUES (?)", (job_hex,))
        sim.at(sim.clock.t + length, f"{job.key}'s row writable again", clear)

    arm(job_hex, state, f"the database refuses {job.key}'s row for {length:.0f}s", start)


def excused(task_kind: str, exc: BaseException) -> bool:
    """The poison's own error, out of a task it may fail."""
    return task_kind in FAILS_WITH_IT and POISON in str(exc)

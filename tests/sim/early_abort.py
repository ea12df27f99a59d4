"""An abort that comes before its job (round 16, review r16's defect A): in bands of the
first draw of `f"{seed}/early-abort"` (about 5.6% of the worlds; none of the safeguards' and
sweep-seed tests' seeds in them, so every other world replays exactly), one job's enqueue
meets a database that drops its commit (not applied, as `dbfaults` drops one), and at that
moment flip-api, which sent the enqueue a moment before, aborts the job: the abort is
handled while the enqueue waits out its retry. The fixed abort is kept (early_aborts) and
the retried enqueue creates the job ABORTED; before 4a86380 it was answered "not found" and
the job ran (`abort-honoured`, tests.sim.abort_invariants).

The job is one the world would run: sites every net has, not a burst's, an enqueue the
product takes. Sweep seeds 0-200 never drew the order (an abort answered before its job was
stored, the job stored after) without this module."""

from __future__ import annotations

import random
import sqlite3
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from app import names
from app.errors import InvalidRequest
from app.schemas import EnqueueJob, job_id_for
from app.sim.simulation import Simulation
from app.usecases import intake
from tests.sim.dbfaults import DB_ERROR

# The first draw's values that give a world the order: gaps between the named seeds' draws
# (tests/unit/test_simulation_*safeguards.py, test_always_on_start_sim.py,
# test_platform_fault_sim.py, test_sweep_seeds.py, test_simulation_hang.py's 0-11).
BANDS = ((0.6880, 0.7110), (0.9160, 0.9495))
STREAM = "early-abort"


def in_bands(seed: int) -> bool:
    """Whether the seed's world draws the order."""
    first = random.Random(f"{seed}/{STREAM}").random()
    return any(lo <= first < hi for lo, hi in BANDS)


class EarlyAbort:
    """Drops one job's first enqueue commit and sends flip-api's abort of it right then."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.key: str | None = None
        self.fired = False
        if not in_bands(sim.seed):
            return
        rng = random.Random(f"{sim.seed}/{STREAM}/job")
        rng.random()  # the band's draw, made on the stream above
        later = {k for b in sim.workload.bursts for k in (b.plain, b.hinted)}
        every = set.intersection(*(set(n.sites) for n in sim.world.nets))
        keys = [
            j.key
            for j in sim.workload.jobs
            if j.key not in later and set(j.sites) <= every and self._takes(j.key)
        ]
        if not keys:
            return
        self.key = rng.choice(keys)
        event.listen(sim.engine, "commit", self._on_commit)

    def _takes(self, key: str) -> bool:
        """The product takes the job's enqueue (hostile metadata past a limit it refuses)."""
        spec = next(j for j in self.sim.workload.jobs if j.key == key)
        try:
            intake.parse_payload(EnqueueJob, self.sim.caller.enqueue_payload(spec))
        except InvalidRequest:
            return False
        return True

    def _on_commit(self, conn: Any) -> None:
        sim = self.sim
        if self.fired or not sim.current:
            return
        message = sim.current[-1]
        payload = message.kwargs.get("payload")
        if (
            message.task != names.ENQUEUE_JOB
            or message.origin != "flip-api"
            or not isinstance(payload, dict)
            or payload.get("caller_key") != self.key
        ):
            return
        self.fired = True
        conn.connection.dbapi_connection.rollback()  # the commit never reached the server
        job_id = str(job_id_for(str(self.key)))
        sim.trace(f"== {self.key}'s enqueue loses its commit; flip-api aborts it now")
        abort = {"payload": {"job_id": job_id, "reason": "aborted by the user"}}
        sim.broker.push(names.ABORT_JOB, abort, origin="flip-api", faulty=False)
        raise OperationalError("COMMIT", None, sqlite3.OperationalError(DB_ERROR))

    def stop(self) -> None:
        """Take the listener off the process's shared engine."""
        if self.key is not None:
            event.remove(self.sim.engine, "commit", self._on_commit)

"""`abort-honoured` (round 16, review r16's early abort): flip-api's abort of a job (or its
`stopped` report), once a worker handled it to an answer, ends the job's runs for good: the
job is never ASSIGNED (claimed, then DISPATCHING) after that answer. An abort of a stored job
moves it to ABORTING or ABORTED, from which no transition leads back; an abort of a job id not
stored yet (its enqueue still waits out a database retry, or sits behind it on the broker) is
kept for REJECTED_RETENTION_S (7 days, far past any world's horizon) and the enqueue that
creates the job creates it ABORTED. Before 4a86380 such an abort was answered "not found" and
dropped, and the job then ran.

"Handled to an answer": the handler returned. A try that raised a database error is retried
(the delivery counts it in `stats["retries"]`), so it binds nothing until a try returns; a
payload the product refuses (`InvalidRequest`: a reason it cannot store) binds nothing
either. Read through the delivery's end (`Checker.after_message`), not its result: the
watch needs no hook in the message layer."""

from __future__ import annotations

import uuid
from typing import Any

from app import names
from app.errors import InvalidRequest
from app.schemas import AbortJob, ReportedStatus, ReportJobStatus, require_storable
from app.sim.db import Unchanged
from app.sim.messages import Message
from app.sim.simulation import Simulation
from app.usecases import intake, records

WATCHED = (names.ABORT_JOB, names.REPORT_JOB_STATUS)
# A stored job's states once an abort (or `stopped`) took: ABORTING, or ended (a finished
# job keeps its end).
TAKEN = ("ABORTING", "ABORTED", "COMPLETED", "FAILED")


def _abort_of(message: Message) -> tuple[uuid.UUID, str] | None:
    """The job a caller's abort (or `stopped` report) is for and its reason, if the product
    takes its payload; None for any other message or a payload it refuses."""
    if message.origin != "flip-api" or message.task not in WATCHED:
        return None
    payload: Any = message.kwargs.get("payload")
    try:
        if message.task == names.ABORT_JOB:
            abort = intake.parse_payload(AbortJob, payload)
            return abort.job_id, require_storable(abort.reason, "reason")
        report = intake.parse_payload(ReportJobStatus, payload)
        if report.status != ReportedStatus.STOPPED:
            return None
        return report.job_id, require_storable(records.reported_reason(report), "reason")
    except InvalidRequest:
        return None


class AbortWatch:
    """The answered aborts, each with the last history row at its answer, and the check
    that no later row claims its job."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._retries: float = 0  # the delivery's retry count at the last call here
        self._aborted: dict[str, tuple[int, float]] = {}  # job hex -> (history mark, when)
        self._event_id = 0
        self._read = Unchanged(sim.conn)
        self.early: set[str] = set()  # jobs whose abort was answered before they were stored

    def after_message(self, message: Message, finished: bool) -> None:
        """A delivery ended: an abort whose try returned binds its job from here on."""
        retries = self.sim.stats.get("retries", 0)
        raised = retries != self._retries  # this try (or one run inside it) was retried
        self._retries = retries
        if not finished or raised:
            return
        abort = _abort_of(message)
        if abort is None:
            return
        job_hex = abort[0].hex
        conn = self.sim.conn
        if job_hex in self._aborted:
            return  # the first answer binds; a duplicate or a second abort changes nothing
        stored = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_hex,)).fetchone()
        if stored is None:
            self.early.add(job_hex)
        elif stored[0] not in TAKEN:
            # A stored job the abort left as it was: its try failed where the design lets a
            # request fail loudly (the poison row's IntegrityError, chaos seed 3050), with no
            # retry to count. An abort that took leaves it ABORTING or ended.
            return
        mark = conn.execute("SELECT coalesce(max(id), 0) FROM job_events").fetchone()[0]
        self._aborted[job_hex] = (mark, self.sim.clock.t)

    def early_then_stored(self) -> int:
        """How many jobs were stored after their abort was answered (the order the review
        found; counted by the band scripts)."""
        conn = self.sim.conn
        return sum(
            conn.execute("SELECT 1 FROM jobs WHERE id = ?", (j,)).fetchone() is not None
            for j in self.early
        )

    def check(self) -> None:
        """`abort-honoured`: no job is claimed after its abort was answered."""
        self._retries = self.sim.stats.get("retries", 0)
        if not self._aborted or self._read.holds():
            return
        rows = self.sim.conn.execute(
            "SELECT id, job_id, to_state FROM job_events WHERE id > ? ORDER BY id",
            (self._event_id,),
        ).fetchall()
        for event_id, job_hex, state in rows:
            self._event_id = event_id
            bound = self._aborted.get(job_hex)
            if bound is None or state not in ("ASSIGNED", "DISPATCHING") or event_id <= bound[0]:
                continue
            self.sim.report(
                "abort-honoured",
                f"job {job_hex[:8]}",
                f"{state} after flip-api's abort (or 'stopped') was answered at"
                f" {bound[1]:.1f}s: the abort was lost and the job runs",
            )
            del self._aborted[job_hex]  # once per job

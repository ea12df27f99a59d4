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
watch needs no hook in the message layer.

`abort-unconfirmed-while-answering` (round 22, review 21b's D1 and D2): an abort answered
once the faults stopped (the drain: nothing fails at random any more) that left its job
ABORTING, with a run of the job live on its net meanwhile, does not end the job ABORTED
`abort_unconfirmed` while its server answered throughout: reachable at every step, the net
declared, its files not found wrong by a worker start, no worker's clock stepped (the
sweep's own one error, tests.sim.abort_blip, is what a re-send must get past). An abort met
by one error is sent again each reconcile round, and a submit whose reply was lost is
looked up by its token, well within ABORT_TIMEOUT_S; before 29fb0ed neither was (the run
trained on until the abort expired)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from app import names
from app.errors import InvalidRequest
from app.handlers import HANDLERS
from app.schemas import AbortJob, ReportedStatus, ReportJobStatus, require_storable
from app.sim.db import Unchanged
from app.sim.messages import Message
from app.sim.simulation import Simulation
from app.sim.state import _secs
from app.usecases import intake, records
from models import ReasonCode

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


UNCONFIRMED = ReasonCode.ABORT_UNCONFIRMED.value


@dataclass
class _Aborting:
    """An abort answered once the faults stopped, its job ABORTING: what the check saw."""

    net: str
    answered_s: float
    clocks: tuple[float, ...]  # the workers' clock offsets at the answer
    live_s: float | None = None  # the last step a run of the job was seen live
    excused: str | None = None  # why its server did not answer throughout


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
        self._aborting: dict[str, _Aborting] = {}  # job hex -> its abort since the drain

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
        stored = conn.execute(
            "SELECT state, net_name FROM jobs WHERE id = ?", (job_hex,)
        ).fetchone()
        if stored is not None and stored[0] == "ABORTING" and stored[1] and self.sim.draining:
            clocks = tuple(c.offset for c in self.sim.process_clocks)
            self._aborting[job_hex] = _Aborting(stored[1], self.sim.clock.t, clocks)
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
        """`abort-honoured`: no job is claimed after its abort was answered;
        `abort-unconfirmed-while-answering`."""
        self._retries = self.sim.stats.get("retries", 0)
        if self._aborting:
            self._unconfirmed()
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

    def _unconfirmed(self) -> None:
        """`abort-unconfirmed-while-answering`: each watched job, while ABORTING, its run seen
        live or its server not answering; once it ended, its end judged."""
        sim = self.sim
        t = sim.clock.t
        for job_hex, watched in list(self._aborting.items()):
            row = sim.conn.execute(
                "SELECT state, reason_code, state_changed_at, nvflare_job_id, step_due_at"
                " FROM jobs WHERE id = ?",
                (job_hex,),
            ).fetchone()
            if row[0] == "ABORTING":
                watched.excused = (
                    watched.excused
                    or self._not_answering(watched, t)
                    or self._no_round_left(row[2], row[3], row[4])
                    or self._row_refused(job_hex)
                )
                job_id = str(uuid.UUID(job_hex))
                if any(
                    r.job_id == job_id and r.net == watched.net and r.live(t)
                    for r in sim.cluster.runs
                ):
                    watched.live_s = t
                continue
            del self._aborting[job_hex]
            if row[1] != UNCONFIRMED or watched.excused or watched.live_s is None:
                continue  # confirmed, excused, or no run of it trained meanwhile
            sim.report(
                "abort-unconfirmed-while-answering",
                f"job {job_hex[:8]}",
                f"ABORTED {UNCONFIRMED} at {t:.1f}s, its abort answered at"
                f" {watched.answered_s:.1f}s after the faults stopped; its server on"
                f" {watched.net} answered throughout, and its run still trained at"
                f" {watched.live_s:.1f}s: the abort was not sent again, or its run not"
                " looked up",
            )

    def _row_refused(self, job_hex: str) -> str | None:
        """The poison row (tests.sim.poison) refuses the job's row now: no re-send of its abort
        can record anything meanwhile (racy 5169: refused 88 s of the abort's 110)."""
        conn = self.sim.conn
        armed = conn.execute(
            "SELECT 1 FROM sqlite_temp_master WHERE type = 'table' AND name = 'sim_poison'"
        ).fetchone()
        if armed is None:
            return None
        row = conn.execute("SELECT 1 FROM temp.sim_poison WHERE job_id = ?", (job_hex,))
        return "its row refused by the poison" if row.fetchone() is not None else None

    def _no_round_left(self, changed: str, run_id: str | None, due: str | None) -> str | None:
        """Whether ABORT_TIMEOUT_S leaves the abort no reconcile round to be sent again in:
        the first that re-sends it comes once it is HOUSEKEEPING_INTERVAL_S old (one that
        looks a submit's run up, none known, once the submit's lease lapsed) and may come a
        whole reconcile period later (racy 1074: the sweep's ABORT_TIMEOUT_S of 60 s, a
        lease of 35 s, rounds every 30 s; with the defaults, 300 s, out of reach)."""
        settings = self.sim.settings
        aborting_s = _secs(changed) or 0.0
        first_s = aborting_s + settings.housekeeping_interval_s
        if run_id is None and due is not None:
            first_s = max(first_s, _secs(due) or 0.0)
        period = HANDLERS[names.RECONCILE].period
        round_s = (period(settings) if period is not None else None) or 0.0
        if first_s + round_s < aborting_s + settings.abort_timeout_s:
            return None
        return f"ABORT_TIMEOUT_S left no reconcile round past {first_s:.1f}s"

    def _not_answering(self, watched: _Aborting, t: float) -> str | None:
        """Why the job's server did not answer throughout, as of now (None: it did)."""
        sim = self.sim
        if not sim.declared_net(watched.net):
            return f"{watched.net} left NETS by {t:.1f}s"
        server = sim.cluster.servers.get(watched.net)
        if server is None or not server.reachable(t):
            return f"{watched.net}'s server not reachable at {t:.1f}s"
        if watched.net in sim.starts.found_wrong:
            return f"{watched.net}'s files found wrong by a worker start at {t:.1f}s"
        if tuple(c.offset for c in sim.process_clocks) != watched.clocks:
            return f"a worker's clock stepped by {t:.1f}s"
        return None

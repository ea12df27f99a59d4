"""The invariants at the end of a run: the world comes to rest once faults stop (every job
ended, no server left up unneeded, no run live, every callback delivered or visibly failed)
within the liveness bound, and everything stored could be stored on PostgreSQL too."""

from __future__ import annotations

import json
from collections import defaultdict

from app.sim.observer import J, JobRow, _uuid
from app.sim.prewarm_invariants import PrewarmInvariants
from models import TERMINAL_JOB_STATES


class Quiescence(PrewarmInvariants):
    """The checks at rest (state and helpers: Observer)."""

    def unsettled(self) -> list[str]:
        """Why the world is not at rest yet (empty: at rest)."""
        sim = self.sim
        t = sim.clock.t
        sim.cluster.advance(t)
        self.read()
        reasons = []
        for job in self.jobs:
            # Liveness: once faults stop, every job ends (not only: none is stuck where a
            # net could take it). The one wait the design leaves to an operator: a job whose
            # own stray run on an always-on net has a status its server never gives.
            if job.state not in TERMINAL_JOB_STATES and not self._left_to_operator(job):
                reasons.append(f"job {job.id[:8]} {job.state} on {job.net}")
        for net in self.nets:
            if (
                sim.scales_to_zero(net.name)
                and not self.needed(net.name)
                and sim.cluster.replicas(net.name) > 0
            ):
                reasons.append(f"net {net.name} {net.state} still has a server")
        for run in sim.cluster.live_runs(t):
            if sim.declared_net(run.net):  # else the operator's (see stray-run-stopped)
                reasons.append(f"run {run.nvflare_id} of job {run.job_id[:8]} still live")
        # Every prewarm's row has its outcome (a live hold keeps the world going).
        reasons += self.open_prewarms()
        if sim.broker.work_pending():
            reasons.append("messages pending")
        if sim.world.callbacks:
            reasons += [f"callbacks {line}" for line in self.undelivered()]
        return reasons

    def storable(self) -> None:
        """Every text the run stored could be stored on PostgreSQL too (the simulation's
        SQLite takes anything): no NUL in a text column, no lone surrogate in a JSON one
        (json.dumps escapes it; PostgreSQL refuses the escape's value in text it extracts,
        and no callback can encode it)."""
        conn = self.sim.conn
        texts = {
            "jobs": ("caller_key", "definition", "last_error"),
            "job_events": ("reason",),
            "net_events": ("reason",),
            "nets": ("last_error",),
            "stray_runs": ("reason",),
            "rejected_requests": ("caller_key", "reason", "callback_last_error"),
            "callback_cursors": ("last_error",),
        }
        for table, columns in texts.items():
            for column in columns:
                row = conn.execute(
                    f"SELECT rowid, {column} FROM {table} WHERE instr({column}, char(0)) > 0"  # noqa: S608 (our own names)
                ).fetchone()
                if row is not None:
                    self.report(
                        "postgres-storable", f"{table}.{column}", f"row {row[0]} holds a NUL"
                    )
        for (text,) in conn.execute("SELECT metadata FROM jobs WHERE metadata IS NOT NULL"):
            try:
                json.dumps(json.loads(text), ensure_ascii=False).encode()
            except UnicodeEncodeError:
                self.report("postgres-storable", "jobs.metadata", "holds a lone surrogate")

    def refused_once(self) -> None:
        """A refusal sent again (a duplicate message, a retry after a commit whose reply was
        lost) is the one already recorded: one row, one `rejected` event, never two."""
        row = self.sim.conn.execute(
            "SELECT caller_key, count(*) FROM rejected_requests WHERE caller_key IS NOT NULL"
            " GROUP BY caller_key, reason, reason_code HAVING count(*) > 1 LIMIT 1"
        ).fetchone()
        if row is not None:
            self.report("refused-once", str(row[0]), f"the same refusal recorded {row[1]} times")

    def liveness_s(self, max_attempts: int) -> float:
        """How long after faults stop a job with this many attempts must have ended."""
        return self.bounds.liveness + max_attempts * self.bounds.per_attempt

    def undelivered(self) -> list[str]:
        """Job events and refused enqueues neither delivered (the receiver accepted them) nor
        visibly undeliverable (settled as failed, with the error kept on the job's cursor or
        the rejection's row), one line per job or rejection."""
        conn = self.sim.conn
        accepted = self.sim.receiver.accepted
        lines = []
        cursors = {
            _uuid(job): (settled, failed, error)
            for job, settled, failed, error in conn.execute(
                "SELECT job_id, settled_through, failed, last_error FROM callback_cursors"
            )
        }
        events: dict[str, list[int]] = defaultdict(list)
        for event_id, job_hex in conn.execute("SELECT id, job_id FROM job_events ORDER BY id"):
            events[_uuid(job_hex)].append(event_id)
        for job_id, ids in events.items():
            settled, failed, error = cursors.get(job_id, (0, 0, None))
            delivered = set(accepted.get(job_id, ()))
            missing = [i for i in ids if i not in delivered]
            visible = [i for i in missing if i <= settled and failed and error]
            hidden = [i for i in missing if i not in visible]
            if hidden:
                lines.append(f"{job_id[:8]} events {hidden} neither delivered nor failed visibly")
        for row_id, settled_at, failed, error in conn.execute(
            "SELECT id, callback_settled_at, callback_failed, callback_last_error"
            " FROM rejected_requests"
        ):
            if f"rejected-{row_id}" in self.sim.receiver.accepted_rejections:
                continue
            if settled_at is None or not (failed and error):
                lines.append(f"rejected-{row_id} neither delivered nor failed visibly")
        return lines

    def _left_to_operator(self, job: JobRow) -> bool:
        if job.state != J.QUEUED or not self._has_strays:
            return False
        rows = self.sim.conn.execute(
            "SELECT net_name, nvflare_job_id, submit_token FROM stray_runs"
            " WHERE replace(job_id, '-', '') = ?",
            (job.id.replace("-", ""),),
        ).fetchall()
        for net, nvflare_id, token in rows:
            if self.sim.scales_to_zero(net):
                continue
            key = nvflare_id or token
            run = next((r for r in self.sim.cluster.runs if key in (r.nvflare_id, r.token)), None)
            if run is not None and run.poisoned:
                return True
        return False

    def quiescence(self, reasons: list[str]) -> None:
        """The world did not come to rest within the liveness bound (`Bounds.liveness` after
        faults stopped): report what stayed unsettled; a job not ended is a liveness
        violation."""
        for reason in reasons:
            if reason == "messages pending":
                continue
            subject = reason.split(" ", 2)[0] + " " + reason.split(" ")[1]
            t = self.sim.clock.t - self.sim.workload.horizon_s
            if reason.startswith("job "):
                self.report(
                    "liveness",
                    subject,
                    f"{reason}: not ended {t:.0f}s after faults stopped (bound: "
                    f"{self.bounds.liveness:.0f}s + max_attempts x {self.bounds.per_attempt:.0f}s)",
                )
            elif reason.startswith("prewarm "):
                self.report("prewarm-settled", subject, f"{reason} {t:.0f}s after faults stopped")
            elif reason.startswith("callbacks "):
                self.report(
                    "callback-delivered",
                    subject,
                    f"{reason} {t:.0f}s after faults stopped",
                )
            else:
                self.report("quiescence", subject, reason)

"""The invariants at the end of a run: the world comes to rest once faults stop (every job
ended, no server left up unneeded, no run live, every callback delivered or visibly failed:
app.sim.state's `unsettled`) within the liveness bound, and everything stored could be
stored on PostgreSQL too."""

from __future__ import annotations

import json

from tests.sim.prewarm_invariants import PrewarmInvariants


class Quiescence(PrewarmInvariants):
    """The checks at rest (state and helpers: Observer)."""

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
                    f"SELECT rowid, {column} FROM {table} WHERE instr({column}, char(0)) > 0"
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
        lost) is the one already recorded: one row, one `rejected` event, never two. Another
        payload under the key refused for the same reason is another request (round 17: its
        own row, told by its digest; tests.sim.refusal_repeat)."""
        row = self.sim.conn.execute(
            "SELECT caller_key, count(*) FROM rejected_requests WHERE caller_key IS NOT NULL"
            " GROUP BY caller_key, reason, reason_code, payload_digest HAVING count(*) > 1"
            " LIMIT 1"
        ).fetchone()
        if row is not None:
            self.report("refused-once", str(row[0]), f"the same refusal recorded {row[1]} times")

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

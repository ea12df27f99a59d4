"""Where a claim places its job, checked at the claim itself (`held-net-taken`): tasks/README.md
"Prewarm" promises that "a job that named no hint leaves a held warm server to its job while
another warm one is free". A temporary trigger on the simulation's one connection sees each
job move to ASSIGNED inside the claim's own transaction (before the claim ends the holds it
uses) and writes down each way the claim broke that promise; a rolled-back claim takes its
rows back with it. Installed only in a world with prewarms.

A claim of job J onto net N is reported when all of these held at the claim:

- N was READY and held by a live prewarm (open, `hold_until` after the claim) that another
  claimable QUEUED job H names (`prewarm_key`) and may run on (unpinned or pinned to N, with
  the sites N declares);
- J named no live hold on N, and no claimable job that may run on N came before J (priority,
  then age, then id): so N was not "hinted" for any job (app.usecases.claims._hinted_here)
  and only its hold put it first;
- another net M was READY, free as claims.py reads it (no active job, no stray run, not
  drained), held by no live prewarm, declared, and J may run on it (unpinned or pinned to M,
  with its sites).

Then the claim, which orders the free nets by warmth, then a net hinted for the job it would
take next, then an unheld net before a held one, would have reached M (as warm, unheld) before
N and given it a job: taking N instead ends H's hold as J's own while an unheld warm net was
free. The conditions are narrower than the promise (a STARTING pair, a job with another ahead
of it are left out), so a correct claim is never reported."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from app.settings import Settings
from app.sim.db import Unchanged

_SCHEMA = """
CREATE TEMP TABLE sim_placement (
    seq INTEGER PRIMARY KEY, job TEXT, net TEXT, at TEXT, job_sites TEXT,
    holder TEXT, holder_sites TEXT, hold TEXT, other TEXT
);
CREATE TEMP TRIGGER sim_placement_claim AFTER UPDATE OF state ON main.jobs
WHEN NEW.state = 'ASSIGNED' AND OLD.state IS NOT 'ASSIGNED'
    AND (SELECT state FROM main.nets WHERE name = NEW.net_name) = 'READY'
BEGIN
    INSERT INTO sim_placement (job, net, at, job_sites, holder, holder_sites, hold, other)
    SELECT NEW.id, NEW.net_name, NEW.assigned_at, NEW.required_sites,
        h.id, h.required_sites, p.caller_key, m.name
    FROM main.prewarms p JOIN main.jobs h ON h.prewarm_key = p.caller_key, main.nets m
    -- N held by a live prewarm that H (claimable, may run on N) names
    WHERE p.net_name = NEW.net_name AND p.outcome IS NULL
        AND p.hold_until > NEW.assigned_at
        AND h.id != NEW.id AND h.state = 'QUEUED'
        AND NOT EXISTS (SELECT 1 FROM main.stray_runs s WHERE s.job_id = h.id)
        AND (h.requested_net IS NULL OR h.requested_net = NEW.net_name)
        -- J names no live hold on N
        AND NOT EXISTS (
            SELECT 1 FROM main.prewarms r
            WHERE r.caller_key = NEW.prewarm_key AND r.net_name = NEW.net_name
                AND r.outcome IS NULL AND r.hold_until > NEW.assigned_at
        )
        -- no claimable job that may run on N comes before J
        AND NOT EXISTS (
            SELECT 1 FROM main.jobs a
            WHERE a.id != NEW.id AND a.state = 'QUEUED'
                AND NOT EXISTS (SELECT 1 FROM main.stray_runs s WHERE s.job_id = a.id)
                AND (a.requested_net IS NULL OR a.requested_net = NEW.net_name)
                AND (a.priority > NEW.priority OR (a.priority = NEW.priority
                    AND (a.created_at < NEW.created_at
                        OR (a.created_at = NEW.created_at AND a.id < NEW.id))))
        )
        -- M: READY, free (no active job, no stray run), unheld, and J may run on it
        AND m.name != NEW.net_name AND m.state = 'READY'
        AND (NEW.requested_net IS NULL OR NEW.requested_net = m.name)
        AND NOT EXISTS (
            SELECT 1 FROM main.jobs b WHERE b.net_name = m.name
                AND b.state IN ('ASSIGNED', 'DISPATCHING', 'RUNNING', 'FINISHING', 'ABORTING')
        )
        AND NOT EXISTS (SELECT 1 FROM main.stray_runs t WHERE t.net_name = m.name)
        -- M not drained, on its own or with the whole deployment ('*', models.drains): a
        -- drained net takes no claim (claims._free), so it is not free and the held net
        -- was the only one as warm (sweep seeds 2089 and 4119, round 13)
        AND NOT EXISTS (SELECT 1 FROM main.drains d WHERE d.scope IN (m.name, '*'))
        AND NOT EXISTS (
            SELECT 1 FROM main.prewarms q WHERE q.net_name = m.name AND q.outcome IS NULL
                AND q.hold_until > NEW.assigned_at
        );
END;
"""


def install(conn: sqlite3.Connection) -> None:
    """Write down every claim that takes a held net while an unheld one is free."""
    conn.executescript(_SCHEMA)


Report = Callable[[str, str, str], None]


class PlacementCheck:
    """Reads the trigger's rows once each and reports those the settings confirm."""

    def __init__(self) -> None:
        self._seen = 0  # the last row read
        self._read: Unchanged | None = None  # (no row written since the last read: none new)
        self._reported: set[str] = set()  # job and claim time: one report a claim

    def check(self, conn: sqlite3.Connection, settings: Settings, report: Report) -> None:
        """Report the claims written since the last check that took a held net."""
        if self._read is None:
            self._read = Unchanged(conn)
        if self._read.holds():
            return
        rows = conn.execute(
            "SELECT seq, job, net, at, job_sites, holder, holder_sites, hold, other"
            " FROM sim_placement WHERE seq > ? ORDER BY seq",
            (self._seen,),
        ).fetchall()
        for seq, job, net, at, job_sites, holder, holder_sites, hold, other in rows:
            self._seen = max(self._seen, seq)
            if f"{job}@{at}" in self._reported:
                continue
            if not (settings.has_net(net) and settings.has_net(other)):
                continue  # a claim never takes a net NETS does not declare
            if settings.net(other).lacks(json.loads(job_sites or "[]")):
                continue  # the unheld net could not take the job
            if settings.net(net).lacks(json.loads(holder_sites or "[]")):
                continue  # the held net could not take its hinted job
            self._reported.add(f"{job}@{at}")
            report(
                "held-net-taken",
                f"job {job[:8]} on {net}",
                f"claimed at {at} onto {net}, held for waiting job {holder[:8]} (prewarm "
                f"{hold[:40]}), while {other} was as warm (READY), free and unheld: the hold "
                "ends as this job's own and its job goes elsewhere",
            )

"""The simulation's own order of prewarm holds, claims and starts (tests.sim.prewarm_invariants):
a hint handled at the very instant a job is claimed, before or after it, has the claim's
timestamp, and two workers' clocks may disagree (a step, app/sim/clock.py), so only the order
in which the rows were written tells which came first. Temporary triggers on the simulation's
one connection number each accepted prewarm row and each claim (a job moved to ASSIGNED) as it
is written (`prewarm-used-by-later-claim`), and note which holds were open (no outcome yet)
when a net was moved to STARTING (`prewarm-start-needs-hold`) and, with their `hold_until`,
when a STARTING net was stopped (`released-while-held`); a rolled-back write takes its rows
back with it. Installed only in a world with prewarms."""

from __future__ import annotations

import sqlite3

_SCHEMA = """
CREATE TEMP TABLE sim_order (
    seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, ref TEXT NOT NULL, net TEXT, at TEXT
);
CREATE TEMP TRIGGER sim_order_hold AFTER INSERT ON main.prewarms WHEN NOT NEW.refused
BEGIN
    INSERT INTO sim_order (kind, ref, net, at)
    VALUES ('hold', CAST(NEW.id AS TEXT), NEW.net_name, NEW.created_at);
END;
CREATE TEMP TABLE sim_start_holds (event INTEGER NOT NULL, hold INTEGER NOT NULL);
CREATE TEMP TRIGGER sim_order_start AFTER INSERT ON main.net_events
WHEN NEW.to_state = 'STARTING'
BEGIN
    INSERT INTO sim_start_holds (event, hold)
    SELECT NEW.id, id FROM main.prewarms
    WHERE net_name = NEW.net_name AND outcome IS NULL AND NOT refused;
END;
CREATE TEMP TABLE sim_release_holds (event INTEGER NOT NULL, hold_until TEXT);
CREATE TEMP TRIGGER sim_order_release AFTER INSERT ON main.net_events
WHEN NEW.from_state = 'STARTING' AND NEW.to_state = 'STOPPING'
BEGIN
    INSERT INTO sim_release_holds (event, hold_until)
    SELECT NEW.id, hold_until FROM main.prewarms
    WHERE net_name = NEW.net_name AND outcome IS NULL AND NOT refused;
END;
CREATE TEMP TRIGGER sim_order_claim AFTER UPDATE OF state ON main.jobs
WHEN NEW.state = 'ASSIGNED' AND OLD.state IS NOT 'ASSIGNED'
BEGIN
    INSERT INTO sim_order (kind, ref, net, at)
    VALUES ('claim', NEW.id, NEW.net_name, NEW.assigned_at);
END;
"""


def install(conn: sqlite3.Connection) -> None:
    """Number every accepted prewarm row and every claim, and note the holds open at every
    start, from now on."""
    conn.executescript(_SCHEMA)


def hold_seq(conn: sqlite3.Connection, prewarm_id: int) -> int | None:
    """When the prewarm row was written, in the simulation's order of writes."""
    row = conn.execute(
        "SELECT seq FROM sim_order WHERE kind = 'hold' AND ref = ?", (str(prewarm_id),)
    ).fetchone()
    return None if row is None else int(row[0])


def claims_of(conn: sqlite3.Connection, job_hex: str, net: str | None) -> list[tuple[int, str]]:
    """Each claim of the job onto the net (None: onto any net): (its place in the order of
    writes, its time)."""
    return [
        (int(seq), at)
        for seq, at in conn.execute(
            "SELECT seq, at FROM sim_order WHERE kind = 'claim' AND ref = ?"
            " AND (? IS NULL OR net = ?) ORDER BY seq",
            (job_hex, net, net),
        )
    ]


def open_at_start(conn: sqlite3.Connection, event_id: int) -> list[tuple[str, float]]:
    """The holds on the net that were open (accepted, no outcome yet) when net event
    `event_id` moved it to STARTING: each one's creation time and `within_s`."""
    return [
        (created, float(within or 0.0))
        for created, within in conn.execute(
            "SELECT p.created_at, p.within_s FROM sim_start_holds s"
            " JOIN prewarms p ON p.id = s.hold WHERE s.event = ? ORDER BY p.id",
            (event_id,),
        )
    ]


def open_at_release(conn: sqlite3.Connection, event_id: int) -> list[str]:
    """The `hold_until` of each hold on the net that was open (accepted, no outcome yet)
    when net event `event_id` moved it from STARTING to STOPPING, as stored."""
    return [
        str(until)
        for (until,) in conn.execute(
            "SELECT hold_until FROM sim_release_holds WHERE event = ?", (event_id,)
        )
    ]

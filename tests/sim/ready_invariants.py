"""The checks on a job-less net's STARTING -> READY move, made as each such move is written
(round 4's fixes 19 and 9, which no other check saw undone):

- `ready-once-ready`: a job-less STARTING net becomes READY only once its server is ready as
  warm_up's own check judges it: the server answers, and the sites its open holds wait for
  (else the net's required sites) are connected; past the net's ready_timeout_s a server
  that answers is READY all the same (README: a net is READY only once its server answers
  and its sites are connected). Reconcile once moved it READY as soon as the driver ran a
  replica, seconds before the server could take a job;
- `idle-from-hold-end`: a net a prewarm started idles from the end of its holds once they
  have all ended, never from a later READY (README: a prewarmed server stays up at most hold
  end + grace + one round). Reconcile once gave such a net a fresh grace from now; and (round
  14's break-it) so did an always-on start past its readiness deadline (STARTING -> OUTAGE,
  `outages.overdue_start`) that came up later (OUTAGE -> READY, `net_repairs._back_up`), so
  that move is checked too when the OUTAGE came straight from the start.

A temporary trigger on the simulation's one connection writes each move down inside its own
transaction (a rolled-back move takes its row with it), with the simulated time and the
server as the platform has it at that instant (the fake's up time, boot, partitions and site
delays, read without moving anything); each net's moves to STARTING are timed the same way.
Both checks are narrower than the promise where the product's clocks may differ from the
simulation's (a worker's clock stepped, tests.sim.adversary): a correct move is never
reported."""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.sim.simulation import Simulation
from tests.sim.observer import Observer, _secs

_SCHEMA = """
CREATE TEMP TABLE sim_net_moves (
    seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, net TEXT NOT NULL, t REAL NOT NULL,
    idle_since TEXT, server TEXT
);
CREATE TEMP TRIGGER sim_net_starting AFTER UPDATE OF state ON main.nets
WHEN NEW.state = 'STARTING' AND OLD.state IS NOT 'STARTING'
BEGIN
    INSERT INTO sim_net_moves (kind, net, t) VALUES ('starting', NEW.name, sim_now());
END;
CREATE TEMP TRIGGER sim_net_claim AFTER UPDATE OF state ON main.jobs
WHEN NEW.state = 'ASSIGNED' AND OLD.state IS NOT 'ASSIGNED'
BEGIN
    INSERT INTO sim_net_moves (kind, net, t) VALUES ('claim', NEW.net_name, sim_now());
END;
CREATE TEMP TRIGGER sim_net_ready AFTER UPDATE OF state ON main.nets
WHEN NEW.state = 'READY' AND OLD.state = 'STARTING'
    AND NOT EXISTS (
        SELECT 1 FROM main.jobs j WHERE j.net_name = NEW.name
            AND j.state IN ('ASSIGNED', 'DISPATCHING', 'RUNNING', 'FINISHING', 'ABORTING')
    )
BEGIN
    INSERT INTO sim_net_moves (kind, net, t, idle_since, server)
    VALUES ('ready', NEW.name, sim_now(), NEW.idle_since, sim_server(NEW.name));
END;
CREATE TEMP TRIGGER sim_net_outage AFTER UPDATE OF state ON main.nets
WHEN NEW.state = 'OUTAGE' AND OLD.state IS NOT 'OUTAGE'
BEGIN
    INSERT INTO sim_net_moves (kind, net, t, server)
    VALUES ('outage', NEW.name, sim_now(), OLD.state);
END;
CREATE TEMP TRIGGER sim_net_back AFTER UPDATE OF state ON main.nets
WHEN NEW.state = 'READY' AND OLD.state = 'OUTAGE'
    AND NOT EXISTS (
        SELECT 1 FROM main.jobs j WHERE j.net_name = NEW.name
            AND j.state IN ('ASSIGNED', 'DISPATCHING', 'RUNNING', 'FINISHING', 'ABORTING')
    )
BEGIN
    INSERT INTO sim_net_moves (kind, net, t, idle_since)
    VALUES ('back', NEW.name, sim_now(), NEW.idle_since);
END;
"""

# How far a product's clock may be from the simulation's where clocks are stepped: a
# worker's clock goes back up to 30 s, forwards under a second (tests.sim.adversary); a
# second elsewhere (a step's own time). Half a millisecond: the stored times' resolution.
CLOCK_STEP_S = 30.0
RESOLUTION_S = 5e-4
# The reason of a job's readiness give-up on its sites, which leaves its net READY with no job
# (app.usecases.dispatch): its deadline counted from its claim, not from the ask.
JOBS_GIVE_UP = "up; the job's sites"


@dataclass(frozen=True)
class ServerThen:
    """The server as the platform had it when the move was written."""

    answering: bool
    sites: frozenset[str]


def _wanted_sets(
    live: list[tuple[float, float, list[str]]], t: float, slack: float
) -> list[set[str]]:
    """Every non-empty set of sites the product may have waited for at `t`: the union of the
    holds live by its clock, which may be up to `slack` from the simulation's. A hold's end is
    a stored time (its hint's end or its cancel), so a clock a little ahead sees a hold ended
    that a clock a little behind sees live (seed 9280: a hold cancelled 17 s before the move,
    in a world whose clocks step 30 s, read as live)."""
    ends = sorted({t - slack, *(end for _, end, _ in live if end < t + slack)})
    sets = []
    for now in ends:
        sites = {s for _, end, hold_sites in live if end > now for s in hold_sites}
        if sites:
            sets.append(sites)
    return sets


def first_ask_s(
    sim: Simulation, net: str, since: float, slack: float, *, taken: bool = False
) -> float | None:
    """When the net's replica was first asked for (a scale_up row, any outcome; `taken`:
    only one the driver took) at or after `since` (a stored time, within `slack`); None:
    none since."""
    taken_only = " AND outcome = 'ok'" if taken else ""
    for (at,) in sim.conn.execute(
        "SELECT at FROM scale_events WHERE net_name = ? AND action = 'scale_up'"
        + taken_only
        + " ORDER BY id",
        (net,),
    ):
        at_s = _secs(at)
        if at_s is not None and at_s >= since - slack:
            return at_s
    return None


class ReadyInvariants(Observer):
    """`ready-once-ready` and `idle-from-hold-end`, from the trigger's rows."""

    def start(self, sim: Simulation) -> None:
        super().start(sim)
        self._moves_seen = 0
        self._moves_at_changes = -1
        self._starting_at: dict[str, float] = {}  # net -> when it last moved to STARTING
        self._claimed_at: dict[str, float] = {}  # net -> when a job was last claimed onto it
        self._start_overdue: set[str] = set()  # nets whose OUTAGE came from their STARTING
        # net -> the reason of its last STARTING -> READY history row (Checker._history reads
        # them before the moves, tests.sim.start_deadlines keeps them)
        self._ready_reason: dict[str, str] = {}
        # How far the product's clocks may be from the simulation's in this world.
        self._slack = CLOCK_STEP_S if sim.profile.clock_step_p else 1.0
        conn = sim.conn
        conn.create_function("sim_now", 0, lambda: sim.clock.t)
        conn.create_function("sim_server", 1, self._server_now)
        conn.executescript(_SCHEMA)

    def _server_now(self, net: str) -> str:
        """The fake server at this instant, as JSON for the trigger's row (nothing moved:
        the cluster's timed changes are left for the next look, as the product sees them)."""
        server = self.sim.cluster.servers.get(net)
        t = self.sim.clock.t
        if server is None:
            return json.dumps({"answering": False, "sites": []})
        return json.dumps({"answering": server.answering(t), "sites": list(server.sites(t))})

    def _net_moves(self) -> None:
        """The moves written since the last step (only if a row changed since)."""
        conn = self.sim.conn
        if conn.total_changes == self._moves_at_changes:
            return
        self._moves_at_changes = conn.total_changes
        rows = conn.execute(
            "SELECT seq, kind, net, t, idle_since, server FROM sim_net_moves WHERE seq > ?"
            " ORDER BY seq",
            (self._moves_seen,),
        ).fetchall()
        for seq, kind, net, t, idle_since, server in rows:
            self._moves_seen = seq
            if kind in ("starting", "claim"):
                (self._starting_at if kind == "starting" else self._claimed_at)[net] = t
                continue
            if kind == "outage":  # (`server`: the state it left)
                if server == "STARTING":
                    self._start_overdue.add(net)
                else:
                    self._start_overdue.discard(net)
                continue
            if kind == "back":
                # A start past its deadline that came up late: idle from its holds' end too.
                if net in self._start_overdue:
                    self._idle_from_hold_end(net, t, _secs(idle_since))
                continue
            then = json.loads(server)
            self._ready_once_ready(net, t, ServerThen(then["answering"], frozenset(then["sites"])))
            self._idle_from_hold_end(net, t, _secs(idle_since))

    def _open_holds(self, net: str) -> list[tuple[float, float, list[str]]]:
        """The net's accepted prewarm rows: (created, the end of the hint, sites), in the
        product's own stored times."""
        max_s = self.sim.settings.prewarm_max_s
        rows = []
        for created, within, ended, sites in self.sim.conn.execute(
            "SELECT created_at, within_s, ended_at, required_sites FROM prewarms"
            " WHERE net_name = ? AND NOT refused",
            (net,),
        ):
            created_s = _secs(created) or 0.0
            end_s = created_s + min(float(within or 0.0), max_s)
            ended_s = _secs(ended)
            if ended_s is not None:
                end_s = min(end_s, ended_s)
            rows.append((created_s, end_s, list(json.loads(sites or "[]"))))
        return rows

    def _ready_once_ready(self, net: str, t: float, server: ServerThen) -> None:
        """The server answered at the move, with the wanted sites connected or past the
        readiness deadline (counted from the start or the first hold, the earlier)."""
        sim = self.sim
        if not sim.declared_net(net):
            return
        asked: float | None = None  # the first ask for its replica, if past the deadline
        if server.answering:
            config = sim.settings.net(net)
            holds = self._open_holds(net)
            live = [h for h in holds if h[1] > t - self._slack]
            wanted = {s for h in live for s in h[2]}
            if set(config.required_sites) <= server.sites or any(
                sites <= server.sites for sites in _wanted_sets(live, t, self._slack)
            ):
                return
            since = min([self._starting_at.get(net, t), *(h[0] for h in live)])
            if t - since > config.ready_timeout_s - self._slack:
                # Past the deadline (as a stepped clock may count it): an answer will do, the
                # deadline counted from the first ask for the replica if there was one (round
                # 16: a start asked for late waits for its sites from the ask, 86c9c12).
                # Not a job's give-up on its sites, which leaves the net READY (dispatch): its
                # chain's deadline counts from its claim.
                start_s = self._starting_at.get(net, since)
                asked = first_ask_s(sim, net, start_s, self._slack)
                jobs = self._ready_reason.get(net, "").startswith(JOBS_GIVE_UP)
                if asked is None or jobs or t - asked > config.ready_timeout_s - self._slack:
                    return
            want = sorted(wanted or set(config.required_sites))
            detail = f"its sites {sorted(server.sites)} connected (wanted {want})"
            if asked is not None:
                detail += f", {t - asked:.1f}s after its replica was asked for"
        else:
            detail = "its server not answering yet (booting, down or cut off)"
        started = self._starting_at.get(net)
        age = f"{t - started:.1f}s after STARTING" if started is not None else "STARTING"
        self.report(
            "ready-once-ready",
            f"net {net} at {t:.1f}",
            f"moved READY with no job {age}, {detail}: warm_up's readiness check would not "
            "have said ready",
        )

    def _idle_from_hold_end(self, net: str, t: float, idle_since: float | None) -> None:
        """Once every hold that wanted this start has ended, the net idles from the last
        end, not from its READY. (A job claimed onto the net since its start needed the
        server until it let go: its chain's READY idles from then.)"""
        started = self._starting_at.get(net)
        if started is None or idle_since is None or self._claimed_at.get(net, -1.0) >= started:
            return
        holds = self._open_holds(net)
        if not any(end > started + self._slack for _, end, _ in holds):
            return  # no hold clearly wanted this start: idle from now is right
        ends = [end for _, end, _ in holds if end > started - self._slack]
        last = max(ends)
        if last > t - self._slack:
            return  # a hold still live (as a stepped clock may see it): idle from now
        if idle_since > last + RESOLUTION_S:
            self.report(
                "idle-from-hold-end",
                f"net {net} at {t:.1f}",
                f"moved READY with no job, idle from {idle_since:.1f}s, after its prewarm "
                f"holds ended at {last:.1f}s: a fresh grace past hold end + grace",
            )

"""The invariants on prewarm holds (app.usecases.prewarm), checked after every step of a
world with prewarms. The hold's end is the checker's own count (`HoldRow.end_s`: the hint's
end, created + PREWARM_MAX_S, or when it was cancelled, used or failed, whichever is
first), never the row's `hold_until`:

- `prewarm-start-needs-hold`: a net is moved to STARTING for a prewarm only while a live
  hold wants it (a cancelled or expired prewarm starts nothing): a hold not ended (cancelled,
  used, failed) before the start in the simulation's order of writes (tests.sim.hold_order),
  whose hint had not run out by the start's own clock;
- `prewarm-ended`: an ended prewarm ended within its hold (ended_at between its creation
  and the end of its hint), so the net's grace starts no later than that; its creation and
  its end may be stamped by two workers, so the end may precede the creation by as much as
  their clocks have disagreed;
- `prewarm-settled` (liveness): every prewarm's row has an outcome within
  `Bounds.prewarm_settle` of its hold's end, once faults have stopped;
- `prewarm-used-by-later-claim`: a hold settled `used` names a job claimed onto its net
  (or, for the job that names it in `prewarm_key`, onto any net) after the hold was made,
  in the simulation's own order of writes (tests.sim.hold_order: a hint made at a claim's
  very instant, after it, has the claim's timestamp), and before its hint's end (a hold is
  live on [created, end));
- `released-while-held` (round 19): a STARTING net is released for its holds' end
  (`warm_up._release`: STOPPING, scaled to 0) only while no hold on it is live, as the
  release's own transaction saw the holds (open, `hold_until` after the move's stamp): a
  warm-up that read no live hold and stalled must not stop a start a hold granted since
  wants (tests.sim.stale_starts; 24d15ca);
- `held-net-taken` (tests.sim.placement, at each claim): a job that names no hint takes a
  READY net held for another waiting job while an unheld READY net it may run on is free.

`idle-net-at-zero` (tests.sim.invariants) counts a net with a live hold as needed, so its
grace starts at the hold's end; `no-scale-down-under-job`, `one-run-per-server` and the run
checks hold with prewarms as without, and a driver is never asked for a second replica
(`one-replica`, tests.sim.call_invariants)."""

from __future__ import annotations

from app.sim.simulation import Simulation
from tests.sim import hold_order, placement
from tests.sim.observer import HoldRow, Observer, _secs, _uuid

PREWARM_REASON = "prewarm"  # how a prewarm's own net moves begin (app.usecases.prewarm*)
RELEASE_REASON = "prewarm: its holds ended"  # warm_up._release's STARTING -> STOPPING


class PrewarmInvariants(Observer):
    """The checks on holds (state: Observer.holds, read with the jobs and nets)."""

    def start(self, sim: Simulation) -> None:
        super().start(sim)
        self._used_checked: set[int] = set()  # prewarm ids whose `used` was checked
        self._used_at_changes = -1
        self._placement = placement.PlacementCheck()
        self._clock_skew = 0.0  # the most two workers' clocks have disagreed so far
        if sim.workload.prewarms:
            hold_order.install(sim.conn)
            placement.install(sim.conn)

    def _prewarm_start(self, event_id: int, net: str, at: str, reason: str) -> None:
        """A net event to STARTING: one a prewarm made needs a live hold on the net."""
        if not reason.startswith(PREWARM_REASON) or not self.sim.workload.prewarms:
            return
        t = _secs(at) or 0.0
        max_s = self.sim.settings.prewarm_max_s
        # Ended or not by the order of writes, never by comparing the start's timestamp with
        # the end's: two workers wrote them, and their clocks may disagree (drift seed 771: a
        # start written just before a claim used the hold, by a worker 0.8 s ahead, read as
        # 0.8 s after the use). Run out or not by the start's own clock against the hint's, as
        # the product judges a deadline (`hold_until > now`); up to its end inclusive.
        if not any(
            t <= (_secs(created) or 0.0) + min(within, max_s)
            for created, within in hold_order.open_at_start(self.sim.conn, event_id)
        ):
            self.report(
                "prewarm-start-needs-hold",
                f"net {net} at {t:.1f}",
                f"STARTING for a prewarm with no live hold on it: {reason[:200]}",
            )

    def _prewarm_release(self, event_id: int, net: str, at: str, reason: str) -> None:
        """A net event STARTING -> STOPPING: a release for its holds' end needs none live."""
        if not reason.startswith(RELEASE_REASON) or not self.sim.workload.prewarms:
            return
        t = _secs(at)
        if t is None:
            return
        # Live as the product judges it in the same transaction (`hold_until > now`), at the
        # stored times' resolution.
        live = [u for u in hold_order.open_at_release(self.sim.conn, event_id) if _live(u, t)]
        if live:
            self.report(
                "released-while-held",
                f"net {net} at {t:.1f}",
                f"STARTING -> STOPPING ({reason[:120]}) while {len(live)} hold(s) on it were "
                f"live (until {min(_secs(u) or 0.0 for u in live):.1f}s)",
            )

    def _prewarms(self, t: float) -> None:
        """Every hold ends within its hint, and is written down once over (liveness); no
        claim took a held net while an unheld one was as warm (`held-net-taken`)."""
        if not self.holds:
            return
        offsets = [0.0, *(clock.offset for clock in self.sim.process_clocks)]
        self._clock_skew = max(self._clock_skew, max(offsets) - min(offsets))
        self._placement.check(self.sim.conn, self.sim.settings, self.report)
        self._used_after_claim()
        horizon = self.sim.workload.horizon_s
        for hold in self.holds:
            if hold.outcome is not None:
                self._ended_within(hold)
                continue
            due = max(hold.end_s, horizon) + self.bounds.prewarm_settle
            if t > due:
                self.report(
                    "prewarm-settled",
                    f"prewarm {hold.key[:40]}",
                    f"still open on {hold.net} at {t:.0f}s: its hold ended at "
                    f"{hold.end_s:.0f}s (bound: {self.bounds.prewarm_settle:.0f}s after that, "
                    "or after faults stopped)",
                )

    def _used_after_claim(self) -> None:
        """A hold settled `used` was used by a claim after it was made and before its end."""
        conn = self.sim.conn
        if conn.total_changes == self._used_at_changes:
            return
        self._used_at_changes = conn.total_changes
        max_s = self.sim.settings.prewarm_max_s
        for pid, key, net, job_hex, created, within, named in conn.execute(
            "SELECT p.id, p.caller_key, p.net_name, p.job_id, p.created_at, p.within_s,"
            " j.prewarm_key = p.caller_key FROM prewarms p LEFT JOIN jobs j ON j.id = p.job_id"
            " WHERE p.outcome = 'used' AND NOT p.refused"
        ):
            if pid in self._used_checked:
                continue
            self._used_checked.add(pid)
            made = hold_order.hold_seq(conn, pid)
            if made is None or job_hex is None:
                continue  # (every accepted row is numbered; a use names its job)
            created_s = _secs(created) or 0.0
            end_s = created_s + min(float(within or 0.0), max_s)
            # A job that names the hold (prewarm_key) ends it wherever it is claimed.
            claims = hold_order.claims_of(conn, job_hex, None if named else net)
            # A claim at the end's instant finds the hold expired (half a microsecond: the
            # stored times' resolution, against the float sum).
            if any(seq > made and (_secs(at) or 0.0) < end_s - 5e-7 for seq, at in claims):
                continue
            seen = ", ".join(f"#{seq} at {_secs(at) or 0.0:.2f}s" for seq, at in claims) or "none"
            self.report(
                "prewarm-used-by-later-claim",
                f"prewarm {key[:40]}",
                f"settled used by job {_uuid(job_hex)[:8]}, whose claims onto {net} ({seen}) "
                f"came before the hold was made (#{made} at {created_s:.2f}s) or at or after "
                f"its end ({end_s:.2f}s)",
            )

    def _ended_within(self, hold: HoldRow) -> None:
        ended = hold.ended_s
        # A hold is ended after it was made, in the order of writes (a cancel or a claim finds
        # it open), but the two stamps may come from two workers' clocks: a claim by a worker
        # 21 s behind ended holds "before" they were made (drift seeds 677, 818, 867 of 600-999,
        # the profile forced). The upper bound holds whatever the clocks: no end passes the
        # row's own hold_until (end_hold clamps it; a claim ends only holds still ahead of it).
        # Less a microsecond: the stored times' resolution (drift seed 69, round 16: an end
        # stamped 0.651 s before its creation by clocks 0.6511679 s apart, 8e-8 s "early").
        made = hold.created_s - self._clock_skew - 1e-6
        if ended is None or not made <= ended <= hold.end_s + 1e-3:
            self.report(
                "prewarm-ended",
                f"prewarm {hold.key[:40]}",
                f"{hold.outcome}, ended at {ended} outside its hold "
                f"({hold.created_s:.1f}s to {hold.end_s:.1f}s)",
            )


def _live(until: str, t: float) -> bool:
    """A hold whose stored `hold_until` is after `t` (half a microsecond: the resolution)."""
    until_s = _secs(until)
    return until_s is not None and until_s > t + 5e-7

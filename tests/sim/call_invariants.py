"""Invariants checked at the moment an adapter is called rather than after a step: a submit
reaches a server only after a readiness check for its job's current assignment, carrying
its bundle as it was when the attempt was claimed (or newer); a scale-down never takes a
server from under an active job."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from app.sim.bundles import S3_DEFINITION, version_of
from app.sim.clock import seconds_of
from app.sim.messages import Message
from app.sim.simulation import Simulation
from tests.sim.observer import Observer


class CallInvariants(Observer):
    """The fakes' on_submit and on_scale (app.sim.host.Host), passed on by the simulation,
    and each message's late scale-downs once it ends."""

    def start(self, sim: Simulation) -> None:
        super().start(sim)
        # Late scale-downs each message's step made: (net, its index in the driver's calls).
        self._late_stops: dict[int, list[tuple[str, int]]] = {}

    def at_admin_call(self, point: str, net: str) -> None:
        """`call-through-wrong-files`: no admin call is sent through files the last start
        found naming another server. `misconfigured-net-called`: no admin call reaches a
        net the dispatcher holds MISCONFIGURED while the platform runs no replica of it:
        nothing there answers. A Flower net's strays wait for a human's fix
        (abort.resting; 6b4fa3b), an NVFLARE net's died with its server and are
        forgotten (misconfig seeds 16 and 50, round 12). The adversary passes on each admin
        hook point inside a worker."""
        sim = self.sim
        found = sim.starts.found_wrong.get(net)
        if found is not None:
            # Round 12: those files reach another server (one that answers, in `another`
            # spells: a stop, abort or submit there acts on the wrong net), so the process
            # sends nothing through them (net_check.RefusingAdmin).
            self.report(
                "call-through-wrong-files",
                f"net {net}",
                f"{point.removeprefix('admin.')} sent through files a start found wrong ({found})",
            )
        if sim.cluster.replicas(net) != 0:
            return
        row = sim.conn.execute(
            "SELECT state, state_changed_at FROM nets WHERE name = ?", (net,)
        ).fetchone()
        if row is None or row[0] != "MISCONFIGURED":
            return
        # A round that read the net before it went MISCONFIGURED (a monitor round's snapshot,
        # its calls made later) calls on what it read: the rule is about rounds after.
        began = sim.delivery.began.get(sim.current[0].id) if sim.current else None
        if began is None or seconds_of(datetime.fromisoformat(row[1])) >= began:
            return
        self.report(
            "misconfigured-net-called",
            f"net {net}",
            f"{point.removeprefix('admin.')} called while MISCONFIGURED at zero replicas",
        )

    def on_submit(self, net: str, token: str, folder: Path, *, repeat: bool = False) -> None:
        """A submit reaches a server: it must be for a job whose current assignment to this
        net passed the readiness check (wait_ready), as the chain promises, and carry its
        bundle as it was when this attempt was claimed, or newer."""
        row = self.sim.conn.execute(
            "SELECT state, net_name, assigned_at, submit_token, definition FROM jobs WHERE id = ?",
            (token[:36].replace("-", ""),),
        ).fetchone()
        if row is None:
            return
        state, job_net, assigned_at, job_token, definition = row
        # A submit that lands after its job ended or is being aborted (a worker paused before
        # it) runs nothing the job uses: the run is settled as a stray, and in reality its
        # folder, swept once the job ended, fails the submit before it leaves the worker.
        moved_on = state in ("COMPLETED", "FAILED", "ABORTED", "ABORTING")
        if not repeat and not moved_on:
            self._check_bundle(token, definition, assigned_at, folder)
        if job_net == net and self.sim.ready_seen.get((token[:36], net)) == assigned_at:
            return
        self.report(
            "submit-after-ready",
            f"job {token[:8]} on {net}",
            f"submit {token[-2:]} reached {net} while the job is {state} on {job_net}"
            f" (token {str(job_token)[-2:]}) without a readiness check for this assignment",
        )

    def _check_bundle(self, token: str, definition: str, assigned_at: str, folder: Path) -> None:
        sim = self.sim
        bundle = sim.s3.bundle if definition == S3_DEFINITION else sim.local_bundle.bundle
        digit = version_of(folder)
        claimed = bundle.version_at(seconds_of(datetime.fromisoformat(assigned_at)))
        # The folder carries its version's last digit only (app.sim.bundles.version_text:
        # every rebuild keeps the file's size), so v55's folder reads 5: it is the newest
        # version with that digit written so far (none newer exists). Read as the digit, a
        # long world's current bundle looked 50 versions old (sweep seed 3250, round 13,
        # from t=1561 s: a job retried 99 times, its bundle rebuilt 55 times). Ten rebuilds
        # or more since the claim make any digit read as current: a miss, never a false report.
        submitted = None if digit is None else bundle.version - (bundle.version - digit) % 10
        if submitted is None:
            self.report(
                "submitted-bundle-current",
                f"submit {token[:8]}-{token[37:]}",
                f"the folder it submits ({folder.name}) is gone or has no {definition} VERSION",
            )
        elif submitted < claimed:
            self.report(
                "submitted-bundle-current",
                f"submit {token[:8]}-{token[37:]}",
                f"carries {definition} v{submitted}; v{claimed} was current when this attempt"
                f" was claimed (now v{bundle.version})",
            )

    def on_scale(self, net: str, replicas: int) -> None:
        """A scale-down must never take a server from under an active job (unless its
        worker was paused past its lease, `_late_stop`); a scale-up (a job's or a
        prewarm's) never asks for a second replica."""
        if replicas > 1:
            self.report("one-replica", f"net {net}", f"driver asked for {replicas}")
        if replicas:
            return
        sim = self.sim
        row = sim.conn.execute(
            "SELECT id, state FROM jobs WHERE net_name = ? AND state IN"
            " ('ASSIGNED', 'DISPATCHING', 'RUNNING', 'ABORTING')",
            (net,),
        ).fetchone()
        if row is not None and self._late_stop(net):
            sim.stats["late stops"] = sim.stats.get("late stops", 0) + 1
            calls = sim.cluster.drivers[net].calls
            self._late_stops.setdefault(sim.current[-1].id, []).append((net, len(calls)))
            sim.trace(f"   !! a late scale-down lands on {net} under job {row[0][:8]}")
        elif row is not None:
            self.report(
                "no-scale-down-under-job",
                f"net {net}",
                f"scaled to 0 while job {row[0][:8]} is {row[1]} on it",
            )

    def _late_stop(self, net: str) -> bool:
        """The scale-down comes from a worker that was paused at this very call for longer
        than the lease its stop held (STUCK_AFTER_S, scaling.stop_net): no platform has a
        conditional scale, so nothing on this side can fence it. The step itself puts the
        replica back when it reads the net again (tests/unit/test_stop_lease.py), and the
        job's lost run is resolved by the monitor like any server restart."""
        resumed = self.sim.resumed
        return (
            resumed is not None
            and resumed[0] == "driver.scale"
            and resumed[1] > self.sim.settings.stuck_after_s
        )

    def after_message(self, message: Message, finished: bool) -> None:
        """A message's delivery ended (`finished`: its task returned or raised; else its
        worker died under it, and it comes back with the same id)."""
        if finished:
            self._check_late_stops(message)
        self._late_stops.pop(message.id, None)

    def _check_late_stops(self, message: Message) -> None:
        """A step whose scale-down landed late (`_late_stop`) asked for the replica back
        before it ended, if a job still holds the net: the claimed job's server is not left
        to the monitor's or reconcile's slower paths."""
        for net, at in self._late_stops.pop(message.id, []):
            if 1 in self.sim.cluster.drivers[net].calls[at:]:
                continue
            row = self.sim.conn.execute(
                "SELECT id, state FROM jobs WHERE net_name = ? AND state IN"
                " ('ASSIGNED', 'DISPATCHING', 'RUNNING', 'ABORTING')",
                (net,),
            ).fetchone()
            if row is not None:
                self.report(
                    "late-stop-undone",
                    f"net {net}",
                    f"a late scale-down took its server from job {row[0][:8]} ({row[1]}) and"
                    f" the step that made it ended without asking for the replica back",
                )

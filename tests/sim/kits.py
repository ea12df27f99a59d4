"""A redeploy that brings a net a kit naming another server (round 11): in about 8% of the
worlds, on its own stream (`f"{seed}/kits"`, drawn in bands of its first draw that none of
the seeds the safeguards and the sweep-seed tests name falls in, so their worlds and every
other replay exactly), one net's admin kit (a Flower net's certificate) dials another host
for a spell: from a redeploy that restarts both workers with it, at a random moment or the
moment the net runs a job, through one to three restarts of a worker with the kit still
wrong, to a restart where a human fixed it. Meanwhile the net's client meets what a kit
dialling another host meets (`SimServer.kit_elsewhere`): nothing answering there
(ServerUnavailable, "cannot connect to server") or another server refusing the kit or its
certificate (AdminMisconfigured; always so for Flower, whose client refuses a certificate
not for its address), and each worker start's check of the files reports it
(app.sim.worker_start), which the product records (`net_check.record_start_check`: its
clients then refuse every call, `RefusingAdmin`). In two more bands of the first draw
(`ANOTHER_BANDS`, round 12) the kit names another net of the world, of the same backend,
whose server answers as its own (`another`): a call sent through those files would stop,
abort or submit on the wrong server. Such a spell lands the moment the net runs a job, and a
user aborts that job 5-30 s later (stream `f"{seed}/kits/another"`): the abort through the
wrong files gets "nothing to abort" from the other server while the run lives on.
In the worlds with two Flower nets (`tests.sim.two_flower`, round 13) the spell is always
drawn (its own stream): the first net's certificate reaches the other's SuperLink, landing
once a job of the first waits FINISHING beside a live run there (no abort): the monitor's
stop of uncounted runs on the FINISHING net lists and stops what it reaches.

At a commit inside a start's transaction (`start.commit`: the old code's reset, committed
before the files were checked), the other worker runs an assign round at once.

`claim-onto-wrong-kit` (at each claim, by a temp trigger that asks the simulation inside the
claim's own transaction): no job is claimed onto a net after a worker start found its files
wrong and before a start found them right (round 11's two defects: e907a8b, b65dd99).
`call-through-wrong-files` (tests.sim.call_invariants, at each admin call): no call is sent
through files a start found wrong."""

from __future__ import annotations

import dataclasses
import functools
import random
import sqlite3
import uuid
from dataclasses import dataclass

from app import names
from app.sim.simulation import Simulation
from app.sim.worker_start import KIT_PORT
from tests.sim import two_flower

# The first draw's values that give a world a spell: two bands none of the named seeds'
# draws falls in (tests/unit/test_simulation_*safeguards.py, test_sweep_seeds.py).
BANDS = ((0.19, 0.228), (0.455, 0.493))
# Round 12's: the kit reaches another net's server that answers (worlds with two nets of one
# backend; the others draw no spell there).
ANOTHER_BANDS = ((0.527, 0.547), (0.956, 0.982))
RESTART = "a worker restarted, the kit of {net} still wrong"


@dataclass(frozen=True)
class Spell:
    """One net's wrong kit: when (or once BUSY after when), how long, the restarts within."""

    net: str
    at: float
    busy: bool  # the redeploy lands the moment the net runs a job (after `at`)
    length_s: float
    answer: str  # what the client meets: "unreachable", "refused" or "another"
    restarts: tuple[tuple[float, tuple[int, ...]], ...]  # (share of the spell, slots)
    other: str | None = None  # `another`: the net whose server the kit reaches
    # Round 13 (tests.sim.two_flower): lands once a job of the net is FINISHING while the
    # other net's SuperLink holds a live run; no user abort.
    finishing: bool = False


def plan(sim: Simulation) -> Spell | None:
    """The world's spell, or None."""
    rng = random.Random(f"{sim.seed}/kits")
    first = rng.random()
    pair = two_flower.pair(sim.workload)
    if pair is not None:  # a world of two Flower nets: its own spell (round 13)
        return _finishing_spell(sim, *pair)
    another = any(lo <= first < hi for lo, hi in ANOTHER_BANDS)
    nets = sim.world.nets
    if another:  # a net with another of its backend, whose server the kit reaches
        nets = tuple(n for n in nets if sum(m.backend == n.backend for m in nets) > 1)
    elif not any(lo <= first < hi for lo, hi in BANDS):
        return None
    if not nets:
        return None
    net = rng.choice(nets)
    horizon = sim.workload.horizon_s
    answer = rng.choice(("unreachable", "unreachable", "refused"))
    restarts = tuple(
        (rng.uniform(0.1, 0.9), rng.choice(((0,), (1,), (0, 1)))) for _ in range(rng.randint(1, 3))
    )
    spell = Spell(
        net=net.name,
        at=rng.uniform(5.0, max(6.0, horizon * 0.6)),
        busy=rng.random() < 0.5,
        length_s=rng.uniform(60.0, 150.0),
        answer="refused" if net.backend == "flower" else answer,
        restarts=restarts,
    )
    if not another:
        return spell
    others = [n.name for n in sim.world.nets if n.backend == net.backend and n is not net]
    return dataclasses.replace(spell, busy=True, answer="another", other=rng.choice(others))


def _finishing_spell(sim: Simulation, net: str, other: str) -> Spell:
    """Round 13's spell: `net`'s certificate names `other`'s SuperLink, landing once a job of
    `net` is FINISHING beside a live run there (stream `f"{seed}/two-flower/kits"`)."""
    rng = random.Random(f"{sim.seed}/two-flower/kits")
    restarts = tuple(
        (rng.uniform(0.1, 0.9), rng.choice(((0,), (1,), (0, 1)))) for _ in range(rng.randint(1, 3))
    )
    return Spell(
        net=net,
        at=5.0,
        busy=True,
        length_s=rng.uniform(60.0, 150.0),
        answer="another",
        restarts=restarts,
        other=other,
        finishing=True,
    )


class KitAdversary:
    """The spell's moments, and the other worker's claim at a commit inside a start."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.spell = plan(sim)

    def schedule(self) -> None:
        """Schedule the redeploy that brings the wrong kit (armed for BUSY in half the worlds)."""
        spell, sim = self.spell, self.sim
        if spell is None:
            return
        label = f"redeploy: {spell.net}'s kit names another server ({spell.answer})"
        if spell.finishing and spell.other is not None:
            when = functools.partial(two_flower.moment, sim, spell.net, spell.other)
            arm = functools.partial(sim.caller.arm, when, two_flower.MOMENT, label, self._now)
            sim.at(spell.at, f"{label}, once FINISHING beside a run on {spell.other}", arm)
            return
        if not spell.busy:
            sim.at(spell.at, label, self._begin)
            return
        # Once the net runs a job: the restart itself an event of that instant, never inside
        # the hook point of a worker's task.
        arm = functools.partial(sim.caller.arm, f"net:{spell.net}", "BUSY", label, self._now)
        sim.at(spell.at, f"{label}, once BUSY", arm)

    def _now(self) -> None:
        self.sim.at(self.sim.clock.t, "the redeploy lands under a job", self._begin)

    def _begin(self) -> None:
        spell, sim = self.spell, self.sim
        assert spell is not None
        if sim.draining:
            return  # faults stop at the horizon
        server = sim.cluster.servers[spell.net]
        dials = f"{spell.other or spell.net + '-other.example'}:{KIT_PORT}"
        server.kit_elsewhere, server.kit_answer = dials, spell.answer
        server.kit_other = spell.other
        for slot in (0, 1):
            sim.restart_worker(slot, f"redeploy: {spell.net}'s kit dials {server.kit_elsewhere}")
        t = sim.clock.t
        for share, slots in spell.restarts:
            sim.at(
                t + share * spell.length_s,
                RESTART.format(net=spell.net),
                functools.partial(self._restart, slots),
            )
        sim.at(t + spell.length_s, f"a human fixes {spell.net}'s kit", self._fix)
        if spell.other is not None and not spell.finishing:
            self._abort_its_job()

    def _abort_its_job(self) -> None:
        """`another`: a user aborts the job the net runs, a little later."""
        sim, spell = self.sim, self.spell
        assert spell is not None
        row = sim.conn.execute(
            "SELECT id FROM jobs WHERE net_name = ? AND state IN ('ASSIGNED', 'DISPATCHING',"
            " 'RUNNING', 'FINISHING')",
            (spell.net,),
        ).fetchone()
        if row is None:
            return
        job_id = str(uuid.UUID(hex=str(row[0]).replace("-", "")))
        delay = random.Random(f"{sim.seed}/kits/another").uniform(5.0, 30.0)
        payload: dict[str, object] = {"job_id": job_id, "reason": "aborted by the user"}
        sim.at(
            sim.clock.t + delay,
            f"flip-api aborts job {job_id[:8]} on {spell.net}",
            sim.caller.sender(names.ABORT_JOB, payload),
        )

    def _restart(self, slots: tuple[int, ...]) -> None:
        assert self.spell is not None
        for slot in slots:
            self.sim.restart_worker(slot, RESTART.format(net=self.spell.net))

    def _fix(self) -> None:
        assert self.spell is not None
        server = self.sim.cluster.servers[self.spell.net]
        server.kit_elsewhere = server.kit_other = None
        for slot in (0, 1):
            self.sim.restart_worker(slot, f"a human fixed {self.spell.net}'s kit")

    def at_start_commit(self) -> None:
        """A commit inside a start's transaction: the other worker runs an assign round now
        (a beat tick due, or one sent now), unless it is busy or stalled."""
        sim = self.sim
        free = {0, 1} - set(sim.running) - {sim.stalled, sim.starts.slot}
        if not free:
            return
        due = [m for m in sim.broker.due(sim.clock.t) if m.task == names.ASSIGN_NEXT_JOB]
        if not due:
            sim.broker.push(names.ASSIGN_NEXT_JOB, {}, origin="beat", faulty=False)
            due = [m for m in sim.broker.due(sim.clock.t) if m.task == names.ASSIGN_NEXT_JOB]
        if not due:
            return  # the broker is down
        slot = min(free)
        sim.broker.take(due[0])
        sim.trace(f"   || w{slot} runs {due[0].label()} inside a worker start")
        sim.deliver(due[0], slot)


_SCHEMA = """
CREATE TEMP TABLE sim_kit_claims (
    seq INTEGER PRIMARY KEY, job TEXT, attempt INTEGER, net TEXT, at TEXT, found TEXT
);
CREATE TEMP TRIGGER sim_kit_claim AFTER UPDATE OF state ON main.jobs
WHEN NEW.state = 'ASSIGNED' AND OLD.state IS NOT 'ASSIGNED'
    AND sim_kit_found_wrong(NEW.net_name) IS NOT NULL
BEGIN
    INSERT INTO sim_kit_claims (job, attempt, net, at, found)
    VALUES (NEW.id, NEW.attempts, NEW.net_name, NEW.assigned_at,
        sim_kit_found_wrong(NEW.net_name));
END;
"""


class KitCheck:
    """`claim-onto-wrong-kit`: reads the trigger's rows (a rolled-back claim takes its row
    back with it) once each."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._seen = 0
        self.active = plan(sim) is not None
        if self.active:
            sim.conn.create_function("sim_kit_found_wrong", 1, sim.starts.found_wrong.get)
            sim.conn.executescript(_SCHEMA)

    def check(self, conn: sqlite3.Connection) -> None:
        if not self.active:
            return
        rows = conn.execute(
            "SELECT seq, job, attempt, net, at, found FROM sim_kit_claims WHERE seq > ?",
            (self._seen,),
        ).fetchall()
        for seq, job, attempt, net, at, found in rows:
            self._seen = max(self._seen, seq)
            self.sim.report(
                "claim-onto-wrong-kit",
                f"job {job[:8]} on {net}",
                f"claimed at {at} (attempt {attempt}) onto {net}, whose files a worker start "
                f"found wrong ({found}) and none has found right since",
            )

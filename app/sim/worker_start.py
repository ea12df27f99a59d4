"""A worker process's start in a simulated world, as `app.celery_app.prepare_nets_at_start`
runs it: each declared net's files checked first (the world's stand-in for
`net_check.endpoint_problem`: a kit a redeploy made dial another server,
`SimServer.kit_elsewhere`), recorded as the product records it (`net_check.
record_start_check`: both simulated workers share one deployment's files, so the one
process-global record is a fair model; `reset` clears it when a simulation ends), then the
start's one transaction, the product's own (`declared_nets.prepare_at_start`). What each
start found is kept (`found_wrong`) for the checks. A commit inside that transaction's body
(the code once committed its reset before checking the files) is a point where another
worker may run: the adversary's `start.commit`."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import event

from app.adapters import net_check
from app.db import unit_of_work
from app.sim.messages import SimOutbox
from app.sim.view import SimView
from app.usecases import declared_nets, kicks

KIT_PORT = 8003  # where a simulated NVFLARE server serves its admin port


def reset() -> None:
    """Forget what the simulation's worker starts found (the record is process-global: a
    sweep's next seed, or a test after it, must not inherit it)."""
    net_check.record_start_check({})


def kit_problem(net: str, dials: str, backend: str) -> str:
    """What the start's check says of files for another server (each backend's words)."""
    if backend == "flower":
        return (
            f"SuperLink certificate of net {net} is not for {net}.superlink (it names "
            f"{dials.rpartition(':')[0]}), the host of flower.address"
        )
    return (
        f"admin kit dials {dials}, but net {net}'s server serves on {net}:{KIT_PORT}: "
        "a kit provisioned for another project or server?"
    )


class WorkerStart:
    """The worker starts of one simulation."""

    def __init__(self, sim: SimView) -> None:
        self.sim = sim
        # Each net the last start that checked it found wrong: net -> what it found, when.
        self.found_wrong: dict[str, str] = {}
        self.slot: int | None = None  # the slot starting now

    def run(self, slot: int) -> None:
        """The start of the worker in `slot`: its file check, then its transaction."""
        sim = self.sim
        problems: dict[str, str] = {}
        for net in sim.settings.nets:
            server = sim.cluster.servers.get(net.name)
            dials = server.kit_elsewhere if server is not None else None
            if dials is None:
                self.found_wrong.pop(net.name, None)
                continue
            problems[net.name] = kit_problem(net.name, dials, net.backend)
            self.found_wrong[net.name] = f"w{slot}'s start at {sim.clock.t:.1f}s: {dials}"
        # Its clients send nothing through files it found wrong (Runtime.admin: RefusingAdmin);
        # a start that finds every file right clears what an earlier one found.
        net_check.record_start_check(problems)
        # A real worker whose start fails on the database starts again: not a case here.
        sim.starting_worker = True
        self.slot = slot
        # The transaction's body runs (a commit now is a commit inside it), and has committed
        # with more to do: the moment is its next statement's, once the session let go of
        # the connection and before it begins again.
        inside, committed = [True], [False]

        def after_commit(_session: Any) -> None:
            committed[0] = inside[0]

        def next_statement(_state: Any) -> None:
            if committed[0]:
                committed[0] = False
                sim.at_hook("start.commit", None, False)

        try:
            with unit_of_work(sim.sessions) as session:
                event.listen(session, "after_commit", after_commit)
                event.listen(session, "do_orm_execute", next_statement)
                declared_nets.prepare_at_start(session, sim.settings, problems, sim.clock())
                inside[0] = False
        finally:
            sim.starting_worker = False
            self.slot = None
        # Once ready (the product's worker_ready): an assign kick if a claimable job waits.
        # No adversary's moment inside: a worker dying there starts again, kicking again.
        ready = dataclasses.replace(
            sim.workers[slot],
            sessions=sim.sessions,
            outbox=SimOutbox(sim.broker, slot, hooked=False),
        )
        kicks.kick_when_ready(ready)

"""What a quiet housekeeping round costs (issue 37: a cheaper beat tick and seed), counted
on a real engine: a monitor round with nothing to settle is one read, whatever it watches; a
reconcile round with nothing to repair reads the fleet once. An extra read coming back
fails these."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from app.usecases import declared_nets, monitor, reconciler


@contextmanager
def statements(sessions) -> Iterator[list[str]]:
    """The statements the engine runs meanwhile (SQLite's BEGIN IMMEDIATE left out)."""
    sent: list[str] = []
    engine = sessions.kw["bind"]

    def note(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        if not sql.startswith("BEGIN"):
            sent.append(" ".join(sql.split())[:100])

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", note)


def _quiet_world(world) -> None:
    """A run on net-a (RUNNING, its server answering) and a QUEUED job waiting for net-a."""
    running = world.enqueue("running", net="net-a")
    world.run_pipeline(running)
    world.enqueue("waiting", net="net-a")
    monitor.monitor_running_jobs(world.rt)  # learns what a first round learns (start time)


def test_a_quiet_monitor_round_is_one_read(world):
    _quiet_world(world)
    with statements(world.rt.sessions) as sent:
        outcomes = monitor.monitor_running_jobs(world.rt)
    assert list(outcomes.values()) == ["running"]
    assert len(sent) == 1, sent


def test_a_quiet_reconcile_round_reads_the_fleet_once(world):
    """Every net with its active job and strays, the leases, the stuck jobs, the rows to
    create and the nets no process declares: one read; besides it only the check of the
    prepared copies (the running job's) and the heartbeat (the nets' stamps are renewed a
    quarter grace old, not every round)."""
    _quiet_world(world)
    reconciler.reconcile(world.rt)  # stamps what this process declares
    with statements(world.rt.sessions) as sent:
        result = reconciler.reconcile(world.rt)
    assert result == reconciler.Reconciled()
    fleet, copies, heartbeat = sent  # nothing else
    assert fleet.startswith("SELECT nets.name, nets.state")
    assert copies.startswith("SELECT jobs.id FROM jobs WHERE jobs.id IN")  # the running job's
    assert heartbeat.startswith("INSERT INTO housekeeping_runs")


def test_a_round_stamps_only_the_nets_whose_stamp_is_a_quarter_grace_old(world):
    """Reconcile re-stamps a declared net's `declared_at` once it is `restamp_after_s` old,
    not every round (issue 37: a quiet round writes nothing); a net it declares is thus never
    older than that plus one round, well inside the grace."""
    reconciler.reconcile(world.rt)
    stamped = world.net("net-a").declared_at
    world.clock.advance(declared_nets.restamp_after_s(world.rt.settings))
    reconciler.reconcile(world.rt)
    assert world.net("net-a").declared_at == stamped
    world.clock.advance(1)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").declared_at == world.clock()

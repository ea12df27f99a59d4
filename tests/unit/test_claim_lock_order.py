"""The claim locks the prewarm holds it ends in one order (id) before ending them: two claims
that each end a hold on the other's net would otherwise lock the rows in opposite orders,
which PostgreSQL settles by killing one claim as a deadlock (the race itself, on a real
server: tests/integration/test_pg_state.py). Here: which rows that lock takes, and that it
is a locking read in id order as PostgreSQL receives it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Select, event
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import ORMExecuteState, Session

from tests.unit.conftest import World
from tests.unit.test_prewarm_key import claim, hold, job, pk, prewarm_row, ready

__all__ = ["pk"]  # the fixture, used by name


@pytest.fixture
def locks() -> Iterator[list[tuple[Select[Any], list[Any]]]]:
    """Every locking read of the prewarms table, with the rows it returned."""
    seen: list[tuple[Select[Any], list[Any]]] = []

    def record(state: ORMExecuteState) -> Any:
        stmt = state.statement
        if not (isinstance(stmt, Select) and stmt._for_update_arg is not None):
            return None
        if "prewarms" not in {getattr(f, "name", None) for f in stmt.get_final_froms()}:
            return None
        frozen = state.invoke_statement().freeze()
        seen.append((stmt, [row[0] for row in frozen().all()]))
        return frozen()

    event.listen(Session, "do_orm_execute", record)
    yield seen
    event.remove(Session, "do_orm_execute", record)


def test_a_claim_locks_the_hold_its_job_names_and_its_nets_in_id_order(pk: World, locks):
    ready(pk, "net-a", "net-b", "net-c")
    hold(pk, "kb", "net-b")  # named by the job: ended wherever the job goes
    hold(pk, "ka", "net-a")  # on the net the job goes to
    hold(pk, "kc", "net-c")  # neither: not locked
    pk.clock.advance(1)
    one = job(pk, "one", net="net-a", prewarm_key="kb")
    assert claim(pk) == (one, "net-a")
    [(stmt, ids)] = locks
    assert ids == sorted([prewarm_row(pk, "ka").id, prewarm_row(pk, "kb").id])
    sql = str(stmt.compile(dialect=postgresql.dialect()))
    assert sql.endswith("ORDER BY prewarms.id FOR UPDATE"), sql


def test_a_plain_job_locks_only_its_nets_live_holds(pk: World, locks):
    ready(pk, "net-a", "net-b")
    hold(pk, "kb", "net-b")
    hold(pk, "ka", "net-a")
    pk.clock.advance(1)
    plain = job(pk, "plain", net="net-a")
    assert claim(pk) == (plain, "net-a")
    assert [ids for _, ids in locks] == [[prewarm_row(pk, "ka").id]]


def test_a_named_hold_at_its_deadlines_instant_is_not_locked(pk: World, locks):
    """A hold is live on [created_at, hold_until): at the deadline's instant it is over, so
    the claim neither ends nor locks it."""
    ready(pk, "net-a", "net-b")
    hold(pk, "kb", "net-b", within_s=10)
    hold(pk, "ka", "net-a", within_s=60)
    pk.clock.advance(10)  # kb's deadline
    named = job(pk, "named", net="net-a", prewarm_key="kb")
    assert claim(pk) == (named, "net-a")
    assert [ids for _, ids in locks] == [[prewarm_row(pk, "ka").id]]
    assert prewarm_row(pk, "kb").job_id is None

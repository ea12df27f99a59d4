"""The simulator's message layer (app/sim/delivery.py) against what Celery does with a
delivery lost after its worker's broker connection dropped while it ran (tasks/base.py
`SentAgainRequest`, `_channel_closed`): the consumer's channel closed in the outage, so the
main process sends no copy and Celery's own reject puts the message back as it was, its
losses header unchanged (tests/unit/test_lost_delivery_promises.py on kombu's SQL
transport; on kombu's Redis transport the reject on the closed channel restores it once Redis
is back). The simulator counts a loss instead, and from the second one holds the message
for the retries' backoff, where Celery sends it back at once: a sweep's world then shows a
pacing the code does not have. Written by a reviewer of 667b8e5."""

from __future__ import annotations

from typing import Any

import pytest

from app import names
from app.sim.faults import CLEAN
from app.sim.interleaving import WorkerKilled
from app.sim.messages import Message
from app.sim.simulation import Simulation
from app.sim.workload import NetSpec, Workload, WorldSpec
from tests.sim.invariants import Checker

pytestmark = pytest.mark.unit


def _world_at_5s() -> Simulation:
    """One net, no workload, the clock at 5 s (when the enqueue below is taken)."""
    world = WorldSpec(nets=(NetSpec("net-a"),))
    sim = Simulation(world, Workload(jobs=(), horizon_s=60.0), CLEAN, seed=1, checker=Checker())
    sim.clock.advance_to(5.0)
    return sim


def _enqueue(**fields: Any) -> Message:
    """flip-api's enqueue, due at 5 s, as one message of task id 1."""
    payload = {"payload": {"caller_key": "k"}}
    return Message(
        id=1, task=names.ENQUEUE_JOB, kwargs=payload, deliver_at=5.0, task_id=1, **fields
    )


@pytest.mark.parametrize("losses", [0, 3])
def test_a_delivery_lost_after_its_channel_closed_in_an_outage_comes_back_as_it_was(
    losses: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken at 5 s, the broker down from 10 s to 20 s (the worker's consumer connection
    drops, its channel closes), the worker process OOM-killed at 25 s, the broker back."""
    sim = _world_at_5s()
    sim.broker.outages = [(10.0, 20.0)]

    def killed_after_the_outage(*args: Any, **kwargs: Any) -> object:
        sim.clock.advance_to(25.0)
        raise WorkerKilled("out of memory")

    monkeypatch.setattr(sim.delivery, "_call", killed_after_the_outage)
    sim.delivery.deliver(_enqueue(losses=losses), 0)
    back = [m for m in sim.broker.pending if m.task_id == 1]
    assert len(back) == 1
    assert back[0].losses == losses, back[0]  # Celery: no copy, its header as it was


def test_a_requests_retry_the_broker_refuses_is_put_back_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tasks/base.py `_apply_rules`: Celery's retry answers a copy the broker refuses with
    Reject(requeue=False), which a caller's request turns into Reject(requeue=True): the
    message goes back as it was (`test_tasks.py`'s refused retry). The simulator dropped it,
    a request the product keeps (found by the review of b1cf934)."""
    from sqlalchemy.exc import OperationalError

    sim = _world_at_5s()

    def database_down(*args: Any, **kwargs: Any) -> object:
        raise OperationalError("INSERT", {}, Exception("connection refused"))

    monkeypatch.setattr(sim.delivery, "_call", database_down)
    monkeypatch.setattr(sim.broker, "push", lambda *args, **kwargs: False)  # refused
    sim.delivery.deliver(_enqueue(retries=2, error_retries=2), 0)
    (back,) = [m for m in sim.broker.pending if m.task_id == 1]
    assert (back.retries, back.error_retries, back.deliver_at) == (2, 2, 5.0)

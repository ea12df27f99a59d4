"""Every allowed and every illegal move of both state machines, and their history rows."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from sqlalchemy import select

from models import (
    JOB_TRANSITIONS,
    NET_TRANSITIONS,
    IllegalTransition,
    Job,
    JobEvent,
    JobState,
    Net,
    NetEvent,
    NetState,
)
from models.reasons import REASONS
from models.states import TERMINAL_JOB_STATES, mermaid

JOB_PAIRS = list(itertools.product(JobState, JobState))
NET_PAIRS = [(a, b) for a, b in itertools.product(NetState, NetState) if a != b]


def _code_for(target: JobState):
    """A reason code the table allows for `target` (None for a move that is not an end)."""
    if target not in TERMINAL_JOB_STATES:
        return None
    return next(code for code, reason in REASONS.items() if target in reason.flip)


def _job(state: JobState, now) -> Job:
    job = Job.new(
        caller_key="k",
        definition="d",
        required_sites=["s"],
        requested_net=None,
        priority=0,
        max_attempts=3,
        now=now,
    )
    job.state = state
    return job


@pytest.mark.parametrize(("source", "target"), JOB_PAIRS, ids=[f"{a}->{b}" for a, b in JOB_PAIRS])
def test_job_move_follows_the_table(source, target, clock, sqlite_factory):
    with sqlite_factory() as session:
        session.add(Net(name="n", state=NetState.STOPPED, state_changed_at=clock()))
        job = _job(source, clock())
        session.add(job)
        session.flush()
        allowed = target in JOB_TRANSITIONS[source]
        if allowed:
            job.transition(target, clock.advance(1), "because", code=_code_for(target))
            session.flush()
            assert job.state == target
            events = session.scalars(select(JobEvent).order_by(JobEvent.id)).all()
            assert (events[-1].from_state, events[-1].to_state, events[-1].reason) == (
                source,
                target,
                "because",
            )
            assert events[-1].at == clock()
        else:
            with pytest.raises(IllegalTransition):
                job.transition(target, clock.advance(1), "because", code=_code_for(target))
            assert job.state == source
            session.flush()
            assert len(session.scalars(select(JobEvent)).all()) == 1  # only "enqueued"


@pytest.mark.parametrize(("source", "target"), NET_PAIRS, ids=[f"{a}->{b}" for a, b in NET_PAIRS])
def test_net_move_follows_the_table(source, target, clock, sqlite_factory):
    with sqlite_factory() as session:
        net = Net(name="n", state=source, state_changed_at=clock())
        session.add(net)
        session.flush()
        if target in NET_TRANSITIONS[source]:
            net.transition(target, clock.advance(1), "why")
            session.flush()
            assert net.state == target
            event = session.scalars(select(NetEvent)).one()
            assert (event.from_state, event.to_state, event.reason) == (source, target, "why")
        else:
            with pytest.raises(IllegalTransition):
                net.transition(target, clock.advance(1), "why")
            assert net.state == source
            session.flush()
            assert session.scalars(select(NetEvent)).all() == []


def test_terminal_job_states_have_no_way_out():
    for state in (JobState.COMPLETED, JobState.FAILED, JobState.ABORTED):
        assert JOB_TRANSITIONS[state] == frozenset()


def test_a_move_and_its_history_roll_back_together(clock, sqlite_factory):
    with sqlite_factory() as session:
        session.add(Net(name="n", state=NetState.STOPPED, state_changed_at=clock()))
        session.commit()
    with sqlite_factory() as session:
        net = session.get(Net, "n")
        net.transition(NetState.STARTING, clock(), "scale up")
        session.flush()
        session.rollback()
    with sqlite_factory() as session:
        assert session.get(Net, "n").state == NetState.STOPPED
        assert session.scalars(select(NetEvent)).all() == []


def test_requeue_counts_attempts_then_fails(clock):
    job = _job(JobState.ASSIGNED, clock())
    job.max_attempts = 2
    job.net_name = "n"
    assert job.requeue("server gone", clock()) is True
    assert (job.state, job.attempts, job.net_name) == (JobState.QUEUED, 1, None)
    job.assign("n", clock())
    assert job.requeue("server gone again", clock()) is False
    assert job.state == JobState.FAILED
    assert job.last_error == "server gone again"
    assert job.net_name is None


def test_submit_token_is_stored_per_attempt(clock):
    job = _job(JobState.ASSIGNED, clock())
    first = job.start_dispatch(clock())
    assert job.submit_token == first == f"{job.id}-0"
    job.requeue("lost", clock())
    job.assign("n", clock())
    assert job.start_dispatch(clock()) == f"{job.id}-1"


def test_a_dispatch_after_a_requeue_that_counted_no_attempt_has_a_token_of_its_own(clock):
    """NVFLARE answers a token it knows with that token's run: every dispatch needs its own,
    in the form nvflare 2.9 accepts."""
    from nvflare.apis.utils.job_submit_token import validate_submit_token

    job = _job(JobState.ASSIGNED, clock())
    first = job.start_dispatch(clock())
    job.requeue("net misconfigured", clock(), count_attempt=False)
    job.assign("n", clock())
    second = job.start_dispatch(clock(), earlier=[0])
    assert (first, second) == (f"{job.id}-0", f"{job.id}-0.1")
    assert validate_submit_token(second) == second


def test_every_dispatch_token_is_new_after_requeues_of_either_kind(clock):
    """Requeues before any dispatch count attempts; a misconfigured net's counts none: no
    two dispatches of one job may share a token whatever the mix."""
    job = _job(JobState.ASSIGNED, clock())
    for _ in range(2):  # readiness timeouts: attempts counted, nothing dispatched
        job.requeue("not ready", clock())
        job.assign("n", clock())
    first = job.start_dispatch(clock())
    job.requeue("net misconfigured", clock(), count_attempt=False)
    job.assign("n", clock())
    second = job.start_dispatch(clock(), earlier=[2])
    assert (first, second) == (f"{job.id}-2", f"{job.id}-2.1")


def test_a_history_without_attempts_keeps_the_older_token_rule(clock):
    """Moves written before migration 0004 have no attempt: a dispatch after one of them
    at attempt 0 still gets its own token."""
    job = _job(JobState.ASSIGNED, clock())
    assert job.start_dispatch(clock(), earlier=[None]) == f"{job.id}-0.1"


def test_readme_diagrams_match_the_tables():
    # app/usecases/README.md "State machines"
    readme = (Path(__file__).resolve().parents[2] / "app" / "usecases" / "README.md").read_text()
    assert mermaid(JOB_TRANSITIONS) in readme, "regenerate the job diagram: fl-dispatcher diagram"
    assert mermaid(NET_TRANSITIONS) in readme, "regenerate the net diagram: fl-dispatcher diagram"

"""Which net a claim gives which job when jobs name their holds (README "Prewarm": "A job
names its hint"): the held net comes first of its warmth only for a waiting job that names
its hold, may run on the net and is the one the net would take next (no claimable job that
may run there ahead of it, by priority, then age, then id); otherwise the held net comes
after an unheld one as warm, so the job that named no hint leaves it to its job, and the
hinted job's hold ends wherever it goes."""

from __future__ import annotations

import pytest

from models import JobState, PrewarmOutcome
from tests.unit.conftest import World
from tests.unit.test_prewarm_key import claim, finish, hold, job, occupy, pk, prewarm_row, ready

__all__ = ["pk"]  # the fixture, used by name


def test_a_hinted_job_pinned_to_its_held_net_meets_it_before_a_younger_plain_job(pk: World):
    """Pinned to the held net is "may run on it": the held net comes first and takes its
    job; the younger plain job would otherwise have taken the unheld net first."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    hinted = job(pk, "hinted", net="net-b", prewarm_key="pw-b")
    job(pk, "plain")
    assert claim(pk) == (hinted, "net-b")
    assert prewarm_row(pk, "pw-b").job_id == hinted


def test_a_hinted_job_pinned_elsewhere_leaves_the_held_net_to_its_unheld_peer(pk: World):
    """A job pinned to net-a that names net-b's hold does not make net-b first: net-a (no
    hold) comes first and takes the pinned job; the younger plain job is not put on the
    held net ahead of it."""
    occupy(pk, "net-c")
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    pinned = job(pk, "pinned", net="net-a", prewarm_key="pw-b")
    plain = job(pk, "plain")
    assert claim(pk) == (pinned, "net-a")
    row = prewarm_row(pk, "pw-b")
    assert (row.outcome, row.job_id) == (PrewarmOutcome.USED, pinned)
    assert claim(pk) == (plain, "net-b")


def test_an_older_job_pinned_to_the_held_net_is_ahead_of_the_hinted_job_there(pk: World):
    """The held net would take the older job pinned to it, so it is not first for the
    younger hinted job: that one goes to the unheld net (its hold ended there), and the
    pinned job then takes its own net."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    pinned = job(pk, "pinned", net="net-b")
    hinted = job(pk, "hinted", prewarm_key="pw-b")
    assert claim(pk) == (hinted, "net-a")
    assert prewarm_row(pk, "pw-b").job_id == hinted
    assert claim(pk) == (pinned, "net-b")


def test_a_job_no_longer_queued_is_not_ahead_of_the_hinted_job(pk: World):
    """Only a claimable job comes before the hinted one: an older job that already left
    (aborted) leaves the held net first for its hinted job."""
    ready(pk, "net-a", "net-b")
    gone = job(pk, "gone")
    assert claim(pk) == (gone, "net-a")
    finish(pk, gone)
    assert pk.job(gone).state == JobState.ABORTED
    hold(pk, "pw-b", "net-b")
    hinted = job(pk, "hinted", prewarm_key="pw-b")
    assert claim(pk) == (hinted, "net-b")


def test_an_older_job_of_lower_priority_is_not_ahead_of_the_hinted_job(pk: World):
    """Priority first, then age: an older but less urgent job does not keep the held net
    from its more urgent hinted job."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    older = job(pk, "older", priority=0)
    hinted = job(pk, "hinted", prewarm_key="pw-b", priority=1)
    assert claim(pk) == (hinted, "net-b")
    assert claim(pk) == (older, "net-a")


def test_a_job_enqueued_at_the_same_instant_with_a_lower_id_is_ahead_of_the_hinted_job(
    pk: World,
):
    """Same priority, same instant: the claim takes the lower id first, so the held net is
    not first for the other job; the first goes to the unheld net, and the held net stays
    for its hinted job."""
    ready(pk, "net-a", "net-b")
    start = pk.clock()
    one = job(pk, "one", prewarm_key="pw-one")
    pk.clock.now = start  # the next job gets the same created_at
    two = job(pk, "two", prewarm_key="pw-two")
    assert pk.job(one).created_at == pk.job(two).created_at
    first, second = sorted([one, two])
    hold(pk, "pw-one" if second == one else "pw-two", "net-b")  # held for the second
    assert claim(pk) == (first, "net-a")
    assert claim(pk) == (second, "net-b")
    assert prewarm_row(pk, "pw-one" if second == one else "pw-two").job_id == second


@pytest.mark.parametrize("why", ["aborted", "stray-run"])
def test_a_hinted_job_that_cannot_be_claimed_does_not_put_its_held_net_first(pk: World, why: str):
    """The job that names the hold must itself be claimable (QUEUED, no run of it that may
    still be alive): otherwise the net is held for a job still to come, and the plain job
    takes the unheld warm net, leaving the hold open."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    hinted = job(pk, "hinted", prewarm_key="pw-b")
    if why == "aborted":
        finish(pk, hinted)
    else:
        pk.add_stray(hinted, "net-c", "run-1")  # its earlier run may still be alive
    plain = job(pk, "plain")
    assert claim(pk) == (plain, "net-a")
    assert prewarm_row(pk, "pw-b").outcome is None

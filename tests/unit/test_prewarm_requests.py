"""What flip-api's prewarm request is answered (tasks/README.md "Prewarm"): the same request
again names the same prewarm and starts nothing more, even retried after a lost commit reply
or across a redeploy; another payload under its key is a conflict that changes nothing; a
cancel ends the hold now and keeps the outcome of one that ended; a MISCONFIGURED net or bad
input is refused and recorded; sites resolve to the net a job would be claimed on."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from app import names
from app.errors import (
    CallerKeyConflict,
    InvalidRequest,
    NetMisconfigured,
    NotFound,
    RequestRejected,
)
from app.handlers import HANDLERS, Verdict, on_error
from app.schemas import PrewarmNet
from app.settings import Settings
from app.usecases import declared_nets, prewarm, scale_down
from app.usecases.prewarm import warm_up as prewarm_warm_up
from app.usecases.prewarm.warm_up import Warm
from models import NetState, PrewarmOutcome
from tests.fixtures.db import net_decl
from tests.unit.lost_commit_reply import commit_reply_lost
from tests.unit.prewarm_world import (
    GRACE_S,
    ROUND_S,
    ask,
    held_ready,
    pw,
    row,
    starts,
    view,
    warm_sent,
    warm_until_ready,
)

__all__ = ["pw"]  # the fixture, used by name


# --- the same request, another payload --------------------------------------------------------


def test_the_same_request_again_names_the_same_prewarm_and_starts_no_second_server(pw):
    ask(pw, "p1", net="net-a", within_s=300)
    pw.clock.advance(5)
    again = ask(pw, "p1", net="net-a", within_s=300, required_sites=["site-2", "site-1"])
    assert not again.created
    assert again.prewarm.created_at == row(pw, "p1").created_at.isoformat()
    assert starts(pw, "net-a") == 1
    # Still STARTING: the warm-up is sent again (the first send may have been lost with a
    # commit's reply); warm_up is idempotent. Once the net is READY, a repeat sends nothing.
    assert again.notified and warm_sent(pw) == ["net-a", "net-a"]
    warm_until_ready(pw, "net-a")
    assert ask(pw, "p1", net="net-a", within_s=300).notified is None


def test_a_prewarm_retried_after_its_commit_reply_was_lost_still_starts_its_server(pw):
    """flip-api's prewarm is stored (net STARTING, hold live) but the commit's reply is lost,
    so the warm_up it would send never goes out; the task is retried (the database could not
    confirm it). The retry must carry the request out as if handled at once: the warm_up is
    sent now, not by the scale-down round's lost-warm_up repair STUCK_AFTER_S later."""
    handler = HANDLERS[names.PREWARM]
    payload = {"caller_key": "p1", "net": "net-a", "within_s": 120}
    with commit_reply_lost(pw.rt.engine), pytest.raises(Exception) as lost:
        handler.call(pw.rt, payload=payload)
    assert on_error(handler, lost.value, 0, pw.rt.settings) is Verdict.RETRY
    assert pw.net("net-a").state == NetState.STARTING  # the commit was applied
    assert warm_sent(pw) == []
    pw.clock.advance(2)  # the retry's backoff
    handler.call(pw.rt, payload=payload)
    assert warm_sent(pw) == ["net-a"]


def test_an_identical_repeat_after_a_redeploy_changed_the_nets_sites_names_the_same_prewarm(
    pw, tmp_path
):
    """The repeat omits required_sites, as the first did; a redeploy meanwhile changed the
    net's required_sites: the same request, never a caller_key_conflict."""
    ask(pw, "p1", net="net-a", within_s=300)
    nets = [
        net_decl(tmp_path, "net-a", "ecs", sites=["site-1", "site-2"], required_sites=["site-1"])
    ]
    redeployed = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=pw.rt.settings.job_root,
        NETS=json.dumps(nets),
    )
    rt = dataclasses.replace(pw.rt, settings=redeployed)
    again = prewarm.request_prewarm(rt, PrewarmNet(caller_key="p1", net="net-a", within_s=300))
    assert not again.created and again.prewarm.caller_key == "p1"
    with pytest.raises(CallerKeyConflict, match="required_sites"):
        prewarm.request_prewarm(
            rt, PrewarmNet(caller_key="p1", net="net-a", within_s=300, required_sites=["site-1"])
        )


def test_a_repeat_omitting_the_sites_the_prewarm_named_explicitly_is_a_conflict(pw):
    """Omitted sites are the net's (site-1 and site-2): a prewarm asked for site-1 alone is
    not what a payload without required_sites asks for, so that repeat is refused as a
    caller_key_conflict, as an enqueue's is."""
    ask(pw, "p1", net="net-a", within_s=300, required_sites=["site-1"])
    with pytest.raises(CallerKeyConflict):
        ask(pw, "p1", net="net-a", within_s=300)


def test_another_payload_under_the_key_is_a_conflict_that_changes_nothing(pw):
    ask(pw, "p1", net="net-a", within_s=300)
    with pytest.raises(CallerKeyConflict, match="within_s"):
        ask(pw, "p1", net="net-a", within_s=900)
    with pytest.raises(CallerKeyConflict, match="net"):
        ask(pw, "p1", net="net-b", within_s=300)
    assert pw.net("net-b").state == NetState.STOPPED
    assert view(pw, "p1").hold_until == row(pw, "p1").hold_until.isoformat()
    assert view(pw, "p1").within_s == 300  # the accepted one is what the key names
    refused = row(pw, "p1", refused=True)
    assert refused.outcome == PrewarmOutcome.CALLER_KEY_CONFLICT


def test_a_repeat_of_an_ended_prewarm_does_not_start_it_again(pw):
    held_ready(pw, within_s=100)
    pw.clock.advance(100 + GRACE_S)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]
    again = ask(pw, "p1", net="net-a", within_s=100)
    assert not again.created and again.prewarm.status == "expired"
    assert pw.net("net-a").state == NetState.STOPPED


# --- cancel ---------------------------------------------------------------------------------


def test_a_cancel_ends_the_hold_now_and_the_grace_starts_then(pw):
    held_ready(pw, within_s=600)
    pw.clock.advance(100)
    cancelled = prewarm.cancel_prewarm(pw.rt, "p1")
    assert cancelled.status == "cancelled" and cancelled.ended_at == pw.clock().isoformat()
    pw.clock.advance(GRACE_S - 1)
    assert scale_down.scale_down_idle_nets(pw.rt) == []
    pw.clock.advance(1)
    assert scale_down.scale_down_idle_nets(pw.rt) == ["net-a"]  # not at 600 s + grace
    assert prewarm.cancel_prewarm(pw.rt, "p1").status == "cancelled"  # harmless repeat


def test_a_cancel_keeps_the_outcome_of_a_prewarm_that_ended(pw):
    held_ready(pw, within_s=100)
    pw.clock.advance(101)
    assert prewarm.cancel_prewarm(pw.rt, "p1").status == "expired"
    held_ready(pw, key="p2", within_s=500)
    pw.run_pipeline(pw.enqueue("job", net="net-a"))
    assert prewarm.cancel_prewarm(pw.rt, "p2").status == "used"


def test_cancelling_an_unknown_or_refused_prewarm_says_so(pw):
    with pytest.raises(NotFound):
        prewarm.cancel_prewarm(pw.rt, "nope")
    with pytest.raises(InvalidRequest):
        ask(pw, "bad", net="net-z", within_s=60)
    with pytest.raises(RequestRejected) as refused:
        prewarm.cancel_prewarm(pw.rt, "bad")
    assert refused.value.reason_code == "rejected"


def test_a_cancel_while_warming_starts_the_grace_at_the_cancel(pw):
    """tasks/README.md: "Cancellable: the hold ends now and the net's idle grace starts". Cancelled
    at 5 s while its server boots, the warm-up carries on, marks the net READY at 50 s with
    idle_since = 50 s, and the server is kept to 110 s instead of 65 s (+ a round)."""
    ask(pw, "p1", net="net-a", within_s=600)
    pw.server("net-a").up = False
    assert prewarm_warm_up.warm_up(pw.rt, "net-a").step == Warm.NOT_READY
    pw.clock.advance(5)
    assert prewarm.cancel_prewarm(pw.rt, "p1").status == "cancelled"
    pw.clock.advance(45)
    pw.server("net-a").up = True
    prewarm_warm_up.warm_up(pw.rt, "net-a")  # the warm_up task keeps polling after the cancel
    pw.clock.advance(GRACE_S - 45 + ROUND_S)  # t = 66: cancel + grace + a round
    scale_down.scale_down_idle_nets(pw.rt)
    assert pw.driver("net-a").replicas == 0, (
        f"server kept past cancel + grace; net is {pw.net('net-a').state}"
    )


# --- refusals -------------------------------------------------------------------------------


def test_a_prewarm_for_a_misconfigured_net_is_refused_and_starts_nothing(pw):
    with pw.rt.sessions.begin() as session:
        declared_nets.mark_misconfigured(
            session, "net-a", "admin kit names another server", pw.clock()
        )
    with pytest.raises(NetMisconfigured, match="MISCONFIGURED: admin kit names another server"):
        ask(pw, "p1", net="net-a", within_s=300)
    assert pw.driver("net-a").calls == [] and pw.net("net-a").state == NetState.MISCONFIGURED
    with pytest.raises(RequestRejected) as looked_up:
        view(pw, "p1")
    assert looked_up.value.reason_code == "net_misconfigured"
    assert row(pw, "p1").net_name == "net-a"  # in the net's prewarm history
    # Fixed and restarted: the same key is a new request now (a refusal takes no key).
    with pw.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, pw.rt.settings, pw.clock(), at_start=True)
    assert ask(pw, "p1", net="net-a", within_s=300).created


def test_sites_whose_every_net_is_misconfigured_are_refused_as_such(pw):
    with pw.rt.sessions.begin() as session:
        declared_nets.mark_misconfigured(session, "net-c", "expired certificate", pw.clock())
    with pytest.raises(NetMisconfigured, match="every net with the sites"):
        ask(pw, "p1", required_sites=["site-3"], within_s=60)
    assert row(pw, "p1").outcome == PrewarmOutcome.NET_MISCONFIGURED


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"net": "net-z"}, "unknown net 'net-z' (known: net-a, net-b, net-c, fixed)"),
        ({"net": "net-a", "required_sites": ["site-3"]}, "required sites ['site-3'] are not on"),
        ({"required_sites": ["site-1", "site-3"]}, "no net has every site"),
        ({}, "required_sites is empty and no net is given"),
    ],
)
def test_bad_input_is_refused_as_an_enqueue_refuses_it_and_recorded(pw, kw, words):
    with pytest.raises(InvalidRequest, match=re.escape(words)):
        ask(pw, "p1", within_s=60, **kw)
    assert row(pw, "p1").outcome == PrewarmOutcome.REJECTED
    assert all(pw.net(n).state == NetState.STOPPED for n in ("net-a", "net-b", "net-c"))


# --- which net ------------------------------------------------------------------------------


def test_sites_resolve_to_the_net_a_job_would_be_claimed_on(pw):
    held_ready(pw, key="warm", net="net-b", within_s=600)
    prewarm.cancel_prewarm(pw.rt, "warm")  # net-b READY and free, no hold on it
    assert ask(pw, "p1", required_sites=["site-1"], within_s=60).prewarm.net == "net-b"
    # net-b is held by p1 now: the next hint for those sites starts net-a for its own job
    second = ask(pw, "p2", required_sites=["site-1"], within_s=60)
    assert second.prewarm.net == "net-a" and second.notified is True
    assert ask(pw, "p3", required_sites=["site-3"], within_s=60).prewarm.net == "net-c"


def test_an_always_on_net_is_only_held(pw):
    answer = ask(pw, "p1", net="fixed", within_s=60)
    assert answer.created and answer.notified is None and "always-on" in answer.prewarm.detail


def test_a_prewarm_outcome_of_a_newer_release_fails_no_read_of_it(pw):
    """As a job's reason code (read_models.StoredReasonCode, review r16): outcomes are added,
    never renamed, so a release rolled back to reads one it does not know. The job views
    read it as null; a prewarm's view took the row's outcome as its status and refusal code
    and failed validation, a 500 for the caller and a failed repeat of the request."""
    from sqlalchemy import update

    from models import Prewarm

    ask(pw, "p1", net="net-a", within_s=300)
    with pw.rt.sessions.begin() as session:
        session.execute(
            update(Prewarm).where(Prewarm.caller_key == "p1").values(outcome="superseded")
        )
    with pw.rt.sessions() as session:
        seen = prewarm.get_prewarm(session, "p1", pw.clock())
    assert (seen.caller_key, seen.status, seen.reason_code) == ("p1", "expired", None)

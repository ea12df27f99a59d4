"""The sweep finds round 11's two defects of a worker start's check of a net's files
(tests/sim/FINDINGS.md, "Round 11: breaking the worker start's check of a net's files"), each
switched back on (monkeypatched to what the code did before its fix), through
tests/sim/kits.py's redeploy that brings a net a kit naming another server, and reports
`claim-onto-wrong-kit`; and round 12's refusing client (a process whose start found a net's
files naming another server sends nothing through them), undone, reports
`call-through-wrong-files` where the kit reaches another net's server (also round 13's: a
FINISHING Flower net's stop of uncounted runs through a certificate naming the other Flower
net's SuperLink, tests/sim/two_flower.py). The rules of
test_simulation_safeguards.py hold here too: seeds are tied to the code, widen a range that
stops finding. The control: the same seeds with the kits' action off report nothing, the fix
undone or not (the action is what finds it)."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy.orm import Session

from app.adapters.backend import AdminClient
from app.runtime import Runtime
from app.settings import Settings
from app.usecases import declared_nets, records
from models import NetState
from tests.sim import kits, two_flower
from tests.sim.sweep import run_seeds
from tests.unit.test_simulation_safeguards import Safeguard, as_params, assert_found

pytestmark = pytest.mark.timeout(1800)  # a guard against a hang (see the other file)


def _reset_committed_before_the_mark(
    session: Session, settings: Settings, problems: dict[str, str], now: datetime
) -> None:
    # Before e907a8b: the start reset every MISCONFIGURED net and committed, then checked
    # the files and marked each wrong one again in a transaction of its own.
    declared_nets.sync_nets(session, settings, now, at_start=True)
    session.commit()
    for name, problem in problems.items():
        declared_nets.mark_misconfigured(session, name, problem, now)
        session.commit()


def _verdict_dropped_under_a_job(session: Session, name: str, reason: str, now: datetime) -> bool:
    # Before b65dd99: a net found misconfigured at start while it ran a job was only logged.
    net = records.get_net(session, name, lock=True)
    if records.active_job(session, name) is not None:
        return False
    net.transition(NetState.MISCONFIGURED, now, reason)
    net.last_error = reason
    return True


def _admin_ignoring_the_start_check(rt: Runtime, net_name: str) -> AdminClient:
    # Before a992d97: the net's client whatever this process's start found of its files.
    with rt._lock:
        if net_name not in rt._admins:
            rt._admins[net_name] = rt.admin_factory(rt.settings.net(net_name), rt.settings)
        return rt._admins[net_name]


START_CHECKS = [
    Safeguard(
        "a start checks the files before it resets a net, in one transaction (e907a8b)",
        lambda mp: mp.setattr(declared_nets, "prepare_at_start", _reset_committed_before_the_mark),
        "ops",
        # A restart within a spell, the net MISCONFIGURED with a job waiting: the other
        # worker's assign round at the reset's commit claims it onto the wrong kit. Ops seed
        # 95 (also chaos 170 of 0-200; 23 of the 98 spell seeds of 0-1200).
        range(95, 96),
        frozenset({"claim-onto-wrong-kit"}),
    ),
    Safeguard(
        "a net found misconfigured at start under a job keeps the verdict (b65dd99)",
        lambda mp: mp.setattr(declared_nets, "mark_misconfigured", _verdict_dropped_under_a_job),
        "misconfig",
        # The spell's redeploy while the net runs a job: once it ends, the net is READY for
        # the next claim. Clean seed 72 found it (14 of the 98 spell seeds of 0-1200) until
        # the simulated start recorded what it found (round 12): the refusing client leaves
        # the job unwatched, so it ends within the spell more rarely. Misconfig seed 1186
        # (also racy 1092; 9 more of the 98 report `ended-run-settled`).
        range(1186, 1187),
        frozenset({"claim-onto-wrong-kit"}),
    ),
    Safeguard(
        "a process sends nothing through files its start found wrong (a992d97)",
        lambda mp: mp.setattr(Runtime, "admin", _admin_ignoring_the_start_check),
        "ops",
        # A spell whose kit reaches another net's server, landed under a job the user then
        # aborts: the abort goes through the wrong files (the other server knows no such
        # run: "nothing to abort", the run lives on). Ops seed 149 (the one of 0-200 whose
        # spell lands; seeds 102 and 114 draw one that never does).
        range(149, 150),
        frozenset({"call-through-wrong-files"}),
    ),
    Safeguard(
        "a FINISHING Flower net's stop of uncounted runs sends nothing through files its start "
        "found wrong (a992d97)",
        lambda mp: mp.setattr(Runtime, "admin", _admin_ignoring_the_start_check),
        "clean",
        # Round 13 (tests/sim/two_flower.py): a world of two Flower nets, net-b's certificate
        # naming net-a's SuperLink from the moment net-b's job waits FINISHING beside net-a's
        # job's run; the monitor's stop of uncounted runs on net-b lists net-a's runs through
        # it (`live_runs` at 90 s) and stops that job's run (the job ends 'aborted' at 105 s).
        # Clean seed 279 (also crashy 101, racy 120, drift 267 and 285, chaos 278: 6 of the
        # 11 two-Flower worlds of 0-300; in 101 a keep-alive ping is the first call); since
        # the worker start's ready kick, 279's first such call is reconcile's, and clean 459
        # is the seed (net-b FINISHING at 121 s, its monitor's `live_runs` at 135 s; 22 of
        # the 39 two-Flower worlds of 0-1200 report the call, most by `live_runs`).
        range(459, 460),
        frozenset({"call-through-wrong-files"}),
    ),
]
FINISHING_STOP = START_CHECKS[-1]


@pytest.mark.parametrize("safeguard", as_params(START_CHECKS), ids=lambda s: s.name)
def test_the_sweep_finds_a_start_check_defect_switched_back_on(
    safeguard: Safeguard, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_found(safeguard, monkeypatch)


def test_the_finishing_flower_nets_stop_is_the_call_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 13's seed reaches the path it was added for: the first call sent through the
    wrong files is the FINISHING net's list of live runs (`stop_uncounted_runs`; a readiness
    lists too, but the net's job waits FINISHING), not some other call on it."""
    FINISHING_STOP.switch_off(monkeypatch)
    [result] = run_seeds(FINISHING_STOP.seed_list())
    found = [v.line() for v in result.violations if v.invariant == "call-through-wrong-files"]
    assert found and "net net-b: live_runs sent through files" in found[0], found


@pytest.mark.parametrize("safeguard", START_CHECKS, ids=lambda s: s.name)
def test_without_the_kits_action_the_same_seeds_report_nothing(
    safeguard: Safeguard, monkeypatch: pytest.MonkeyPatch
) -> None:
    safeguard.switch_off(monkeypatch)
    monkeypatch.setattr(kits, "BANDS", ())  # no spell: no kit ever names another server
    monkeypatch.setattr(kits, "ANOTHER_BANDS", ())
    monkeypatch.setattr(two_flower, "pair", lambda _workload: None)  # nor round 13's spell
    seen = {r.seed: [v.line() for v in r.violations] for r in run_seeds(safeguard.seed_list())}
    assert seen == {seed: [] for seed in safeguard.seed_list()}

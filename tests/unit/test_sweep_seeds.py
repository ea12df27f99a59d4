"""Seeds of the simulator's long sweep that reported a violation before their fix, replayed:
each stays clean (tests/sim/FINDINGS.md says what each found; the minimal reproductions on the
use cases are in the files of the behaviour they pin)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("seed", [231, 1025, 1157, 748, 771, 791, 561, 4946, 8284, 8780])
def test_the_long_sweeps_findings_stay_fixed(seed):
    """Seeds of the 200-2000 sweep that reported a violation before their fix (app/sim/
    FINDINGS.md): 231 the checker timing a net's grace from its stop rather than from a
    server scaled up by hand, 1025 a stale wait_ready raising for a net it did not mark,
    1157 no human redeploying an always-on net whose server failed to start. Of the
    10,000-seed sweep (tests/sim/FINDINGS.md, "The long sweep's seeds 748 and 771"),
    checker errors: 748 (flaky) a run's settling timed across a broker outage, 771 (drift)
    a prewarm start judged against a hold's end stamped by another worker's clock; 791
    (chaos, the sweep on 868f6cc) a checker error, a run's end read by a round whose write
    the poison row refused. 561 (racy, on a Flower net): a submit paused between the
    adapter's lookup and its start-run started a second run of the attempt (the adapter now
    keeps the token's first run and stops its own). 4946 (ops, the 10,000-seed sweep on
    ad3f17b): a prewarmed start, its hold cancelled, found up by reconcile after a redeploy to
    always-on, idled from then rather than from the hold's end (8284, servers, the same); 8780
    (ops) the same redeploy made such a start READY with none of its sites connected."""
    from tests.sim.seeds import run_seed

    result = run_seed(seed)
    assert [v.invariant for v in result.violations] == []


@pytest.mark.parametrize("seed", [870, 434, 319, 499, 947, 1387])
def test_the_flower_faults_findings_stay_fixed(seed):
    """Seeds the Flower-fault actions (tests/sim/flower_faults.py) found on main's code with
    every earlier fix in place (tests/sim/FINDINGS.md): a stray run of a net whose pending
    runs revive taken for gone with its server, which revived later with no job counting it
    (870 drift, 319 servers, 499 servers, 947 crashy) or beside its job's next attempt (1387
    flaky). 434 (crashy), listed with them, replays clean on the code before the fix too (an
    earlier placement of the crash found it): kept, the race and the crash on one net."""
    from tests.sim.seeds import run_seed

    result = run_seed(seed)
    assert [v.invariant for v in result.violations] == []


def test_seed_508_a_later_run_of_the_token_through_an_outage():
    """508 (servers): the race's later run, its reply lost as the always-on SuperLink became
    unreachable for 126 s; nothing can stop it while no one reaches the SuperLink, and once
    it answers the lost job's stray (which keeps the token) stops it, or, had the job run on,
    the monitor's stop of the runs its job does not count (round 10; the checker bounds such
    a run from the SuperLink's last unreachable moment, tests/sim/run_invariants.py)."""
    from tests.sim.seeds import run_seed

    result = run_seed(508)
    assert [v.invariant for v in result.violations] == []


@pytest.mark.parametrize("seed", [259, 505, 42, 2345])
def test_round_10_s_findings_stay_fixed(seed):
    """Round 10 (tests/sim/FINDINGS.md): 259 (misconfig) a net misconfigured while its stray
    aged rested at zero after the fix though no start had failed to settle it (product);
    505 (flaky, a SuperLink refusing every stop for good) the checker's queued-while-free
    counting a resting net as free; 42 (drift) the checker reading a DISPATCHING job's two
    runs of its token as both counted; 2345 (drift) a token's later run on a SuperLink no one
    reached, taken for unaccounted before it answered (checker)."""
    from tests.sim.seeds import run_seed

    result = run_seed(seed)
    assert [v.invariant for v in result.violations] == []


def test_seed_241_a_clock_stepped_back_behind_a_fix_and_a_stray():
    """241 (misconfig, a GONE world whose net was MISCONFIGURED then fixed, its clocks stepped
    back three hours): a settling start every 120 s from the step (`settle-storm`) until the
    fix was placed by the order of the net's events rather than by its time (round 13)."""
    from tests.sim.seeds import run_seed

    result = run_seed(241)
    assert [v.invariant for v in result.violations] == []


def test_a_stray_pending_through_its_nets_rest_is_not_counted_as_lost():
    """1275 (drift, a SuperLink dying with a run pending, then refusing every stop): the
    settling start at 150 s fails (the driver's circuit breaker), the net is stopped at its
    readiness deadline and rests at zero as long as the stray had waited (90 s), as the
    README promises; the run waits in the state database meanwhile, no process of it
    running. `stray-run-stopped` counted that rest against the dispatcher (checker)."""
    from tests.sim.seeds import run_seed

    result = run_seed(1275)
    assert [v.invariant for v in result.violations] == []


def test_unpinned_jobs_whose_only_net_is_left_to_an_operator_wait_for_it():
    """1760 (ops, two Flower nets): net-b removed from NETS, net-a's SuperLink gone for good
    holding a stray; the unpinned jobs' only net is one the claim passes by until an operator
    settles its stray (paged: StrayRunsNeedOperator). `liveness` excused that wait only for
    a job pinned to such a net (checker, found by round 13's break-it sweep of 1400:1800)."""
    from tests.sim.seeds import run_seed

    result = run_seed(1760)
    assert [v.invariant for v in result.violations] == []


@pytest.mark.parametrize("seed", [7349, 8159])
def test_a_stray_an_always_on_superlink_will_not_stop_is_left_to_an_operator(seed):
    """7349 (ops, DEAF: net-c's SuperLink dies at 95.9 s with its job's run pending, then
    refuses every stop; a PER_JOB_FL_SERVER flip at 114.7 s makes the net always-on): the
    job fails, its run revives as a stray at 178 s and every stop (each round, 198 in all)
    is refused. The dispatcher restarts no always-on server; it logs "stray runs need an
    operator" and the claim passes net-c by, with the job pinned to it waiting (README,
    FlDispatcherStrayRunsNeedOperator). `stray-run-stopped`, `queued-while-free` and
    `liveness` counted that wait against the dispatcher (checker, round 14). 8159 (ops) the
    same: DEAF at 86.6 s, the flip at 135.1 s; at rest by 285 s now (34,950 s before)."""
    from tests.sim.seeds import run_seed

    result = run_seed(seed)
    assert [v.invariant for v in result.violations] == []


def test_seed_6684_a_misfit_nets_crash_at_every_start_run_stops_with_the_faults():
    """6684 (drift, MISFIT: net-b's SuperLink dies at every start-run whose run is pending):
    the crash went on after faults stopped at 170 s, 20 times more, so every job on net-b
    (net-a removed at 51 s) was lost at each of its attempts and failed; the last of
    the queue, at priority -1000, was still QUEUED at the liveness deadline, its run
    pending in the dead SuperLink's database (checker: tests.sim.flower_faults, round 14)."""
    from tests.sim.seeds import run_seed

    result = run_seed(6684)
    assert [v.invariant for v in result.violations] == []


@pytest.mark.parametrize("seed", [2420, 3040])
def test_a_completion_unseen_in_an_outage_and_a_throttled_take_down_are_within_bounds(seed):
    """Round 13's 10,000-seed sweep, checker errors: 2420 (chaos) a run completed 16 s into
    84 s of broker outage and its server was scaled to 0 by hand before the broker came back;
    `one-counted-run` took the server's answering during the outage for monitor rounds that
    could have seen the end (none ran), and the job's rerun for a second completion. 3040
    (misconfig, STEP) a stray pending in a dead SuperLink's database while the driver
    throttled its net's take-down three rounds running; only a STOPPED net is started to
    settle it, and `stray-run-stopped` counted that wait against the dispatcher."""
    from tests.sim.seeds import run_seed

    result = run_seed(seed)
    assert [v.invariant for v in result.violations] == []


@pytest.mark.parametrize("seed", [2089, 4119, 3250])
def test_drained_nets_and_bundle_versions_past_ten_are_read_right(seed):
    """Round 13's 10,000-seed sweep (tests/sim/FINDINGS.md), checker errors: 2089 (flaky)
    and 4119 (drift) `held-net-taken` named as the unheld warm net one an operator had
    drained, which no claim takes (tests/sim/placement.py); 3250 (flaky, a job retried 99
    times, its folder rebuilt 55 times) `submitted-bundle-current` read the folder's one-digit
    version (v55 writes 5) as the version itself (tests/sim/call_invariants.py)."""
    from tests.sim.seeds import run_seed

    result = run_seed(seed)
    assert [v.invariant for v in result.violations] == []


@pytest.mark.parametrize("seed", [2145, 2958])
def test_a_token_s_later_run_no_list_or_reply_has_shown_is_not_yet_counted(seed):
    """Round 13's 10,000-seed sweep (tests/sim/FINDINGS.md), checker errors: a token's later
    Flower run the product cannot know yet, beside a claim whose readiness stops it before
    its submit (revived_runs.stop_before_submit), so the server never runs two at once.
    2145 (racy): its start-run's worker stalled, the job aborted (freeing the net) with the
    run it adopted; 2958 (drift, IDLE): its lists refused until its job completed, the net
    claimed at once by a job waiting for a site that never comes, twice."""
    from tests.sim.seeds import run_seed

    result = run_seed(seed)
    assert [v.invariant for v in result.violations] == []


def test_seed_6634_two_failed_rounds_the_grace_apart_rerun_no_completed_run():
    """6634 (flaky): one monitor round's calls to net-c failed at 32.4 s, no round ran until
    58.4 s, whose calls failed too (8% of calls fail in that profile); the run had completed
    meanwhile and was requeued, to run again. Lost now takes SERVER_LOST_ROUNDS rounds."""
    from tests.sim.seeds import run_seed

    result = run_seed(6634)
    assert [v.invariant for v in result.violations] == []


@pytest.mark.parametrize("seed", [4550, 8187])
def test_a_restart_with_a_kit_still_wrong_keeps_the_lost_grace(seed):
    """Round 14 (tests/sim/FINDINGS.md): every worker start that found a net's kit still
    wrong cleared `unreachable_since` (declared_nets.sync_nets), so under restarts 15-30 s
    apart the monitor's grace never ran out. 4550 (ops): net-b's kit names net-c's server
    from 95 s under job ac633aef, whose run finishes at 99 s; the user aborts it at 122.8 s;
    it was ABORTED at 210 s (now 135 s). 8187 (drift): net-a's kit names another host from
    47 s under job dc3106c9, its server dies at 94 s; it was requeued at 210 s (now 90 s)."""
    from tests.sim.seeds import run_seed

    result = run_seed(seed)
    assert [v.invariant for v in result.violations] == []


def test_seed_5946_a_start_no_job_needs_is_taken_down_within_its_bound():
    """5946 (drift): idle-net-at-zero at 237.2 s, a checker error (tests/sim/FINDINGS.md,
    Round 14): net-a's server, scaled up by hand at 67 s while its settings named a missing
    service (tests.sim.misfit), was counted idle across the 130 s no driver call could take
    it down; the dispatcher stopped it 72 s after the human's fix."""
    from tests.sim.seeds import run_seed

    result = run_seed(5946)
    assert [v.invariant for v in result.violations] == []


def test_seed_69_an_end_stamped_by_a_clock_behind_within_a_microsecond():
    """(drift, round 16) A prewarm made by a worker whose clock ran 0.6511679 s ahead and
    cancelled at once by the other: stored to the microsecond, the end read 8e-8 s before
    the creation less the clocks' skew, a `prewarm-ended` by the checker's float sum, not
    the product (tests/sim/prewarm_invariants.py allows the stored times' resolution)."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(69).violations] == []


def test_seed_3050_an_abort_a_poison_row_refused_binds_nothing():
    """(chaos, round 16's 3,000-10,000 sweep) flip-api's abort of a stored job failed on the
    poison row (IntegrityError: the design lets it fail loudly, unretried), and the job ran
    later: `abort-honoured` took the failed try for an answer. An abort binds its stored
    job only once it took (the job ABORTING or ended: tests/sim/abort_invariants.py)."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(3050).violations] == []


def test_seed_5435_a_warm_up_gives_up_a_boot_another_has_just_asked_for():
    """(chaos) A broker outage held net-c's warm_up messages past ready_timeout_s; two ran at
    once at 101.3 s. w0's asked the driver for the replica and, before its scale event was
    written (the row comes after the call), w1's read the driver (desired 1, set by w0) and
    no ask since STARTING, so it counted from STARTING and gave the start up: UNHEALTHY,
    scaled down, its holds failed, 0.0 s after the ask. `start-given-up-early` reports it.
    Fixed: a start past its deadline counted from STARTING whose driver desires the replica
    while no ask is recorded is asked again, and counts from that ask
    (`outages.ask_unrecorded`; warm_up and reconcile's abandon)."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(5435).violations] == []


def test_seed_5853_a_warm_up_stalled_across_a_new_start_leaves_that_start_alone():
    """(racy) w0's warm_up read net-a STARTING (12.4 s) and stalled 53 s at driver.observe;
    meanwhile the net came up, went down, and job 06c78d98's claim started it again (72.3 s)
    and asked for its replica (72.5 s); the job was aborted. Resumed at 73.6 s, the warm-up
    counted the deadline from the start it had read (its ask at 12.4 s) and gave the new start
    up 1.1 s after its ask (UNHEALTHY, scaled down; `start-given-up-early`). Fixed: warm_up
    gives up only the start it read (its STARTING stamp re-checked under the row lock)."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(5853).violations] == []


def test_seed_9241_a_prewarmed_start_back_from_an_always_on_outage_idles_from_its_holds_end():
    """(misconfig) A prewarm started net-b; a redeploy made it always-on at its start, and
    the start, its replica cut off, an OUTAGE past the deadline; its hold ended at 2.9 s (a
    drain). A redeploy back to scale-to-zero: reconcile moved it OUTAGE -> READY idling from
    180.3 s, a fresh grace past hold end + grace (`idle-from-hold-end`). Fixed: that move
    idles from its holds' end as `_back_up`'s does (`net_repairs._set_net_state`)."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(9241).violations] == []


def test_seed_9798_a_net_whose_platform_refuses_every_scale_call_is_not_idle_at_zero():
    """(drift; a checker error) The platform refused every scale call for net-a from 1.4 s
    to 255 s (tests.sim.platform_faults' REFUSE); net-a, STOPPING with no job from 51 s, was
    reported at 201 s (`idle-net-at-zero`) though no product could take its server down
    meanwhile. The checker counted a broken driver's time out, not a refusing platform's or
    an access denial's: now it does (`SimDriver.takes_no_scale`)."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(9798).violations] == []


@pytest.mark.parametrize("seed", [3524, 8249, 8446])
def test_a_refusal_band_world_whose_own_request_is_refused_too_is_clean(seed):
    """(ops 3524, 8249, servers 8446; a checker error) `refusal_repeat`'s worlds: a redeploy
    had removed the net of the workload's own request under the key, so the corrected
    request was refused too, a refusal of its own; `one-refusal-per-request` counted every
    refusal under the key against the module's payloads only (2 for 1, 3 for 2). It counts
    the refusals of its own payloads now."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(seed).violations] == []


def test_seed_7487_a_band_worlds_request_retried_is_never_dropped_by_the_broker():
    """(chaos 7487; a checker error, round 18's sweep) `kombu_values`' second payload hung to
    the soft time limit and was retried; the simulated broker dropped the retry's copy (a
    message lost on the way: nothing a product keeps), and `request-kept` found its refusal
    missing. The band worlds' sends are never dropped, and now neither are their retries
    (`Message.faulty`)."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(7487).violations] == []


def test_seed_5996_a_worker_start_after_a_kill_in_a_refusal_is_not_that_refusals_commit():
    """(5996; the harness crashed, round 18's sweep) A worker killed while a `refusal_repeat`
    band world's refusal opened its transaction restarts, and its start's commit was taken
    for the refusal's by the band's lost-reply listener: an OperationalError out of the
    simulation itself. The listener now fires only inside the handler."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(5996).violations] == []


def test_seed_5687_two_stalls_at_one_scale_call_are_one_late_stop():
    """(5687; a checker error, round 19's sweep of the stale-start band) w0's reconcile took
    net-b's drifted server down (STOPPING, its stop leased) and stalled at the scale call
    115 s (the band), then 18 s more at the same call (the racy profile's slow platform);
    meanwhile job ad614975 was claimed onto net-b and ran. The scale to 0 landed under it,
    133 s after the lease began, and the step asked for the replica back (a late stop,
    `_late_stop`); the checker read only the last pause's 18 s, short of STUCK_AFTER_S, and
    reported `no-scale-down-under-job`. Two pauses at one call now count as one stall."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(5687).violations] == []


def test_seed_7116_a_release_kept_for_a_hold_granted_meanwhile_warms_on():
    """(7116; round 19's sweep of the stale-start band) w0's warm_up of net-b's start read no
    live hold, stalled, and, stale-start-1 granted on that very start meanwhile (its grant
    sent no warm-up: this one was under way), kept the start but ended its polls: STARTING
    with no ask for 40 s, abandoned by reconcile at the deadline as warm_up's re-sent poll
    asked (`start-given-up-early`). Fixed: the kept start is warmed on."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(7116).violations] == []


def test_seed_7336_a_deaf_superlinks_stray_lives_until_its_idle_net_is_taken_down():
    """(flaky 7336; a checker error, round 19's sweep of the stale-start band) net-a's
    SuperLink died with job dc3106c9's run pending and came back refusing every StopRun
    (DEAF); the job was requeued at 93 s, and the net started to settle its stray at 121 s,
    READY at 180 s with the run hanging, taken down at its idle grace at 270 s (the README:
    a Flower net is never taken down for its strays). `stray-run-stopped` and
    `queued-while-free` counted from the requeue (bound 164 s) as if a stop could end the
    run. While such a SuperLink answers, the run's bound counts from the take-down (which
    `idle-net-at-zero` bounds) and the net is not free."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(7336).violations] == []


def test_seed_9280_a_hold_cancelled_before_a_ready_move_is_not_waited_for():
    """(flaky 9280; a checker error, round 19's sweep of the stale-start band) job-0's hold on
    net-b (both sites) was cancelled at 169 s and pw-3's (site-1 only) warmed net-b up; warm_up
    moved it READY at 186 s with site-1 connected, as pw-3 asked. `ready-once-ready` counted
    every hold whose end was within the world's 30 s clock step of the move as live (a
    cancelled one too) and wanted both sites. It now accepts any set of holds a clock within
    the step could see live."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(9280).violations] == []


# The long-queue band's two worlds of round 20: a receiver answering 429 to every event
# while some 60 jobs had events due. Each 429 held back only its job, so every round sent
# every due event again (500 requests in 90 s), each round its worker's whole budget, back
# to back: the housekeeping behind them waited and beat's messages expired. A 5xx, 408 or
# 429 is now tried like no answer (two in a row and the receiver rests). The round's budget
# read time.monotonic, which the simulated clock did not drive: it reads the runtime's
# monotonic clock now, which the simulation drives.
def test_seed_1339_a_receiver_answering_429_to_all_leaves_no_completed_run_unseen():
    """(misconfig 1339) A run that completed at 92 s was read only after net-b's admin kit
    broke (174 s): requeued by the lost-job policy and run again (`ended-run-settled`,
    `one-counted-run`). Found by round 20's long-queue band; the same with 0e920a5 undone."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(1339).violations] == []


def test_seed_4109_a_finishing_jobs_report_timeout_is_settled_within_its_bound():
    """(ops 4109) Job 12e62ff1 FINISHING 101 s (bound 80 s): no monitor round ran from 90 s
    to 194 s while deliver_callbacks rounds sent 429-answered events (100 s -> 191 s). Found
    by the long-queue band's worlds of 3,500-5,000 on round 20's final code."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(4109).violations] == []


# Round 23's sweep of the ranges round 22 left (2,200-4,999, 7,200-9,999): two checker errors.
def test_seed_7361_a_warm_up_giving_up_its_own_start_is_not_read_as_a_jobs_chain():
    """(chaos 7361) A prewarm started net-b at 0 s and a broker outage held its warm-up; a
    job claimed onto the start at 130.3 s asked for the replica and was aborted; the warm-up,
    redelivered at 131.0 s, gave the start up 130 s after its first ask (the job-less rule).
    The checker read it as the aborted job's wait_ready (the same words) and counted from
    the claim: `start-given-up-early` at 0.8 s. A warm-up now says "prewarm: not ready
    after", which the checker counts as a job-less start."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(7361).violations] == []


def test_seed_2339_a_requeue_on_a_probe_inside_a_partition_is_the_lost_job_policys():
    """(chaos 2339) net-a (a Flower net) was partitioned 86.5-136.5 s and its run completed
    meanwhile; the monitor round that began at 135 s probed it inside the partition (30 s not
    answering) and requeued the job at 136.8 s. The checker asked whether the server answered
    at its own instant (136.9 s), after the partition: `completed-run-rerun`. It now asks
    whether the workers' last admin call was answered (`SimServer.refused_last`)."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(2339).violations] == []


def test_seed_8445_a_request_sent_while_the_job_folder_is_gone_is_refused_for_it():
    """(racy 8445) The gone-bundle band removed the job folder at 134.8 s (written back at
    136.0 s); flip-api's corrected request of the kombu band came at 135.2 s and was refused,
    rightly, for the folder: the checker expected a job (`request-kept`). It now counts a
    refusal for the folder, in a world whose folder was removed, as one distinct refusal
    more and no lost job."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(8445).violations] == []


def test_seed_9773_a_late_submits_settle_asks_nothing_of_a_misconfigured_net():
    """(chaos 9773) w0's dispatch stalled 90 s after its submit; meanwhile net-a's admin kit
    broke and the net was MISCONFIGURED at zero replicas. Resumed at 241.5 s, the dispatch
    found its run "landed after the job moved on" and sent settle_stray_runs, which called
    job_status on the MISCONFIGURED net (`misconfigured-net-called`): only reconcile asked
    whether a net was resting. The settle asks it itself now, whoever sends it."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(9773).violations] == []


def test_seed_5169_an_abort_whose_row_the_database_refuses_may_expire_unconfirmed():
    """(racy 5169) Job 3a52e3a9 was aborted at 189.7 s and the poison band refused its row
    from then for 88 s: reconcile's re-sends at 210 s and 240 s failed on it, and the next
    round after the row was writable again (300.5 s) found the abort past ABORT_TIMEOUT_S.
    `abort-unconfirmed-while-answering` (round 22) did not know the poison; it now excuses an
    abort whose job's row was refused while it was ABORTING."""
    from tests.sim.seeds import run_seed

    assert [v.invariant for v in run_seed(5169).violations] == []

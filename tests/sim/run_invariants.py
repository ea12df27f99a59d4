"""The invariants on runs, checked after every step: one live run per server and per job,
every live run counted by its job or recorded as a stray (never both) and stopped when
neither, one counted completion per job, an ended run settled, and no claim of a net where
another run lives. Counted against the cluster's TRUE record of runs."""

from __future__ import annotations

from collections import defaultdict

from app.sim.servers import Run
from app.usecases.net_repairs import SETTLE_REST_MAX_S
from models import NetState
from tests.sim.observer import J, Observer, _secs
from tests.sim.ready_invariants import CLOCK_STEP_S
from tests.sim.rest_window import RestWindow


class RunInvariants(Observer):
    """The checks on runs (state and helpers: Observer)."""

    _rest_window: RestWindow  # the checker's (tests.sim.invariants)

    def _runs(self, t: float) -> None:
        b = self.bounds
        live: dict[str, list[Run]] = defaultdict(list)
        completed: dict[str, list[Run]] = defaultdict(list)
        by_id: dict[str, Run] = {}
        for run in self.sim.cluster.runs:
            by_id[run.nvflare_id] = run
            if run.live(t):
                live[run.job_id].append(run)
            elif run.completed(t) and self._counted_completion(run, t):
                completed[run.job_id].append(run)
        per_net: dict[str, list[Run]] = defaultdict(list)
        for runs in live.values():
            for run in runs:
                if not self._later_of_its_token(run, runs, t):
                    per_net[run.net].append(run)
        for net, runs in sorted(per_net.items()):
            if len(runs) > 1:
                self.report(
                    "one-run-per-server",
                    f"net {net}",
                    "live runs "
                    + ", ".join(f"{r.nvflare_id} (job {r.job_id[:8]}-{r.attempt})" for r in runs),
                )
        for job_id, runs in live.items():
            if sum(not self._later_of_its_token(r, runs, t) for r in runs) > 1:
                self.report(
                    "one-live-run",
                    f"job {job_id[:8]}",
                    "live runs " + ", ".join(f"{r.nvflare_id} ({r.token[-2:]})" for r in runs),
                )
            for run in runs:
                if self.counts(run):
                    self._orphan_since.pop(run.nvflare_id, None)
                    if self.recorded_stray(run):
                        # Counted twice: the net could be settled under its job, or the job
                        # held back by a run it owns.
                        self.report(
                            "counted-once",
                            f"run {run.nvflare_id}",
                            f"counted by its job {job_id[:8]} and recorded as a stray run",
                        )
                    continue
                since = self._orphan_since.setdefault(run.nvflare_id, t)
                job = self.job(job_id)
                job_state, job_net = (str(job.state), str(job.net)) if job else ("?", "?")
                where = f"its job {job_id[:8]} is {job_state} on {job_net}"
                # A token's later run on a SuperLink no one reached (see _later_of_its_token):
                # nothing can record or stop it until it answers (seed 2345).
                if getattr(self.sim.cluster.servers[run.net], "lists_refused", False):
                    # Its SuperLink lists no run (tests.sim.flower_faults' IDLE): nothing
                    # can find it to stop it until the lists answer again.
                    self._token_unreached_at[run.net] = t
                    self._unreachable_at[run.net] = t
                    self._lists_refused_at[run.net] = t
                if self._unlisted_under_a_claim(run):
                    # Round 13, drift 2958: an unlisted later run (lists refused since its
                    # start-run) on a net another job has claimed since: neither the monitor
                    # (no job runs there) nor the idle round (the net is not idle) lists it,
                    # and the claimed job's readiness stops it only before its submit
                    # (revived_runs.stop_before_submit, once the job's sites are in): the
                    # README promises no more. Still one run on the server (one-run-per-server
                    # at the submit); its bounds count from the last claim.
                    self._token_unreached_at[run.net] = t
                    self._unreachable_at[run.net] = t
                    self._held_unlisted_at[run.net] = t
                reached = max(since, self._token_unreached_at.get(run.net, since))
                if t - reached > b.unaccounted and not self.recorded_stray(run):
                    self.report(
                        "unaccounted-run",
                        f"run {run.nvflare_id}",
                        f"live for {t - since:.0f}s (bound {b.unaccounted:.0f}s), neither counted"
                        f" by its job nor recorded as a stray run: {where}",
                    )
                if not self.sim.declared_net(run.net):
                    # A server NETS no longer declares is the operator's
                    # (app/entrypoints/README.md, "A net removed from NETS": nothing of the
                    # dispatcher reaches it); its runs are the dispatcher's to stop again
                    # only from the net's next declaration on.
                    self._undeclared_at[run.net] = t
                    continue
                if not self.sim.scales_to_zero(run.net) and not self.sim.cluster.servers[
                    run.net
                ].answering(t):
                    # Nothing can stop a run on an always-on server no one reaches (an
                    # outage): its bound counts from when the server answers again. (A
                    # scale-to-zero net is taken down whether it answers or not.)
                    self._unreachable_at[run.net] = t
                if self.sim.state.deaf_for_good(run.net):
                    # Nor on an always-on server that refuses every stop (ops 7349: DEAF, its
                    # net made always-on by a PER_JOB_FL_SERVER flip): the dispatcher asks at
                    # every round and logs "stray runs need an operator"
                    # (abort.expire_stray_runs), but restarts no always-on server: the README's
                    # FlDispatcherStrayRunsNeedOperator. Counted from a fix or a flip back.
                    self._unreachable_at[run.net] = t
                if self.sim.state.deaf_and_up(run.net):
                    # Nor while a scale-to-zero SuperLink refusing every stop runs it (DEAF):
                    # the dispatcher never takes a Flower net down for its strays (README,
                    # FlDispatcherStrayRunsNeedOperator), so the run ends with the net's
                    # take-down at its idle grace, which `idle-net-at-zero` bounds (seed 7336:
                    # a settling start READY 180 s, taken down at 270 s, the bound counted
                    # from the job's requeue at 93 s). Counted from the take-down.
                    self._unreachable_at[run.net] = t
                if any(n.name == run.net and n.state == NetState.MISCONFIGURED for n in self.nets):
                    # Nor on a net whose settings are wrong: it is a human's until the fix
                    # (abort.resting: not called meanwhile; tests.sim.misfit).
                    self._unreachable_at[run.net] = t
                if (
                    run.pending(t)
                    and not self.sim.cluster.servers[run.net].answering(t)
                    and any(n.name == run.net and n.state == NetState.STOPPING for n in self.nets)
                ):
                    # Nor before its net's take-down is confirmed (misconfig 3040: a stray
                    # pending in a dead SuperLink's database, the stop's driver calls
                    # throttled three rounds running): no process of it runs, no server can
                    # stop it, and only a STOPPED net is started to settle it
                    # (net_repairs._start_to_settle). The bound counts from the STOPPED; a
                    # net left STOPPING for good keeps the run live at rest (quiescence).
                    self._unreachable_at[run.net] = t
                if run.pending(t) and self._rest_promised(run.net, t):
                    # The term the orphan bound lacked (drift seed 1275): a Flower net's
                    # stray whose settling start failed (the driver's circuit breaker, a
                    # SuperLink that did not come up) is stopped at its readiness deadline
                    # and rests at zero before the next start, as long as the stray had
                    # waited (doubling, at most SETTLE_REST_MAX_S): the README's promise on
                    # strays ("StrayRunsNeedOperator"). Its run waits in the state database
                    # meanwhile, no process of it running; the bound counts from the rest's
                    # end, when the next start must settle it (a run that does run then is
                    # counted as before).
                    self._unreachable_at[run.net] = t
                since = max(
                    since,
                    self._undeclared_at.get(run.net, since),
                    self._unreachable_at.get(run.net, since),
                )
                if t - since > b.orphan:
                    self.report(
                        "stray-run-stopped",
                        f"run {run.nvflare_id}",
                        f"live for {t - since:.0f}s (bound {b.orphan:.0f}s) while {where}",
                    )
        for job_id, runs in completed.items():
            if len(runs) > 1:
                self.report(
                    "one-counted-run",
                    f"job {job_id[:8]}",
                    "completed runs " + ", ".join(r.nvflare_id for r in runs),
                )
        for job in self.jobs:
            if job.state not in (J.RUNNING, J.ABORTING) or job.nvflare_id is None:
                self._dead_since.pop(job.id, None)
                continue
            recorded = by_id.get(job.nvflare_id)
            if (
                recorded is None
                or recorded.live(t)
                or recorded.poisoned
                or _unseen_end(recorded, t)
            ):
                # A run whose status the server never gives cannot be seen to end: only
                # MAX_RUN_S (max-run-enforced) bounds it.
                self._dead_since.pop(job.id, None)
                continue
            # Nothing settles a run while the broker is down (no beat tick reaches a worker):
            # the outage's time is not counted, as app/entrypoints/README.md "Failures and
            # recovery" bounds it (Redis restarted while RUNNING: HOUSEKEEPING_INTERVAL_S
            # after the reconnect). Flaky seed 748: a run ended 11 s into 115 s of outage,
            # settled 9 s after it.
            dead = self._dead_since.setdefault(job.id, t)
            since = self._after_broker_outages(dead, t)
            if job.net is not None and not self.sim.declared_net(job.net):
                self._undeclared_at[job.net] = t  # bounded by the removal slack below
            else:
                # A net declared again: nothing reached it while it was not (its job waited
                # for the removal's own bound), so its run's end is settled from then on
                # (seed 194: removed while its run ran, added again 110 s later).
                since = max(since, self._undeclared_at.get(str(job.net), since))
            if t - since > b.settle + self._removal_slack(job.net):
                how = _how_ended(recorded, t)
                paused = f", the broker down {since - dead:.0f}s of it" if since > dead else ""
                self.report(
                    "ended-run-settled",
                    f"job {job.id[:8]}",
                    f"{job.state} for {t - dead:.0f}s after its run {job.nvflare_id} {how}"
                    f" (bound {b.settle:.0f}s{paused})",
                )

    def _rest_promised(self, net: str, t: float) -> bool:
        """The net rests at zero between starts to settle its strays (`RestWindow`), and no
        longer than app.usecases.net_repairs._settle_rest_s promises: as long as its oldest
        stray had waited at the stop, at most SETTLE_REST_MAX_S (the longest for a stray
        dated after the stop by a stepped clock), read from the product's stamps, so give
        or take two clock steps (a stamp of each worker, and this step's time against it)."""
        row = next((n for n in self.nets if n.name == net), None)
        if row is None or not self._rest_window.resting(row, t):
            return False
        oldest = self.sim.conn.execute(
            "SELECT min(created_at) FROM stray_runs WHERE net_name = ?", (net,)
        ).fetchone()[0]
        recorded = _secs(oldest)
        if recorded is None:
            return False
        waited = row.changed_s - recorded
        rest = min(waited, SETTLE_REST_MAX_S) if waited >= 0 else SETTLE_REST_MAX_S
        slack = CLOCK_STEP_S if self.sim.profile.clock_step_p else 1.0
        return t - row.changed_s <= rest + 2 * slack

    def _later_of_its_token(self, run: Run, runs: list[Run], t: float) -> bool:
        """A later run of a token whose earlier run lives too (and is the one its job
        counts), on a Flower net, for at most the unaccounted bound: from its start-run
        while a step of its attempt is still to run (its retry's lookup stops it: a
        SuperLink keeps no token; sweep seeds 42 and 163 once tests.sim.flower_faults raced
        two submits of one attempt), or from the SuperLink's last unreachable moment since
        that start-run (nothing can stop it then; after it, with the step's retries spent,
        the monitor's stop of the runs its job does not count: seed 508). One that outlives
        its attempt's steps, or the bound, is reported."""
        server = self.sim.cluster.servers[run.net]
        if server.spec.backend != "flower":
            return False
        job = self.job(run.job_id)
        if job is not None and job.nvflare_id == run.nvflare_id:
            return False  # its job adopted this one: the earlier run is the one left
        # Flower run ids are the SuperLink's run numbers, in the order it started them.
        if not any(r.token == run.token and int(r.nvflare_id) < int(run.nvflare_id) for r in runs):
            return False
        bound = self.bounds.unaccounted
        if not server.reachable(t):
            self._token_unreached_at[run.net] = t
            return True
        unreached = self._token_unreached_at.get(run.net, -1.0)
        if unreached >= run.submitted_at and t - unreached <= bound:
            return True
        if t - run.submitted_at > bound:
            return False
        sim = self.sim
        return any(
            str(m.kwargs.get("job_id")) == run.job_id and m.kwargs.get("attempt") == run.attempt
            for m in (*sim.broker.pending, *sim.current)
        )

    def _claims(self, t: float) -> None:
        """A net with a live run never takes another job: when a claim is first seen (the
        step right after it), no run of another job or attempt lives on the net."""
        for job in self.jobs:
            if job.state != J.ASSIGNED or job.net is None:
                continue
            key = (job.id, job.attempt)
            if key in self._claims_seen:
                continue
            self._claims_seen.add(key)
            beside = [
                r
                for r in self.sim.cluster.runs
                if r.net == job.net
                and r.live(t)
                # A run pending in the database of a SuperLink that is down runs no process;
                # the next SuperLink starts it, and the claimed job's readiness stops it
                # before its submit (app.usecases.revived_runs): one-live-run and
                # unaccounted-run watch it from then on.
                and not r.dormant
                and (r.job_id != job.id or r.attempt != job.attempt)
                and not (r.job_id != job.id and self._unlisted_later_run(r, t))
                and not (r.job_id != job.id and self._unanswered_later_run(r, t))
            ]
            if beside:
                self.report(
                    "claim-beside-live-run",
                    f"net {job.net}",
                    f"job {job.id[:8]} (attempt {job.attempt}) claimed it while run "
                    + ", ".join(f"{r.nvflare_id} (job {r.job_id[:8]}-{r.attempt})" for r in beside)
                    + " lives there",
                )

    def _unlisted_later_run(self, run: Run, t: float) -> bool:
        """A token's later run of another job, on a Flower net whose SuperLink refused every
        list of its runs since its start-run, within the unaccounted bound
        (tests.sim.flower_faults' IDLE: the lists answer again in the round that ends its
        job, whose release claims the net at once):
        the claim cannot know it; the claimed job's readiness stops it before its submit
        (revived_runs.stop_before_submit), one-run-per-server from then on."""
        if self.sim.cluster.servers[run.net].spec.backend != "flower":
            return False  # (an NVFLARE run's id is no number: round 16's gone_bundle worlds)
        job = self.job(run.job_id)
        if job is not None and job.nvflare_id == run.nvflare_id:
            return False
        if not any(
            r.token == run.token and r.net == run.net and int(r.nvflare_id) < int(run.nvflare_id)
            for r in self.sim.cluster.runs
        ):
            return False  # not a later run of its token (Flower run ids are in start order)
        refused = self._lists_refused_at.get(run.net, -1.0)
        if refused >= run.submitted_at and t - refused <= self.bounds.unaccounted:
            return True
        # Or claimed since (drift 2958: the first claim's job waits for a site that never
        # comes; its attempt 1 is claimed again): see _unlisted_under_a_claim.
        held = self._held_unlisted_at.get(run.net, -1.0)
        return held >= run.submitted_at and t - held <= self.bounds.unaccounted

    def _later_run_of_another(self, run: Run) -> bool:
        """A Flower run its job did not adopt, of a token with an earlier run on its net (a
        second start-run of one attempt: tests.sim.flower_faults' race)."""
        if self.sim.cluster.servers[run.net].spec.backend != "flower":
            return False
        job = self.job(run.job_id)
        if job is not None and job.nvflare_id == run.nvflare_id:
            return False
        return any(
            r.token == run.token and r.net == run.net and int(r.nvflare_id) < int(run.nvflare_id)
            for r in self.sim.cluster.runs
        )

    def _unlisted_under_a_claim(self, run: Run) -> bool:
        """A token's later run no list showed since its start-run (its SuperLink's lists
        refused), on a net another job has claimed and not yet submitted to (ASSIGNED)."""
        if self._lists_refused_at.get(run.net, -1.0) < run.submitted_at:
            return False
        if not self._later_run_of_another(run):
            return False
        return any(
            j.state == J.ASSIGNED and j.net == run.net and j.id != run.job_id for j in self.jobs
        )

    def _unanswered_later_run(self, run: Run, t: float) -> bool:
        """A token's later run whose start-run has not answered yet, within the unaccounted
        bound: a step of its attempt is still to run (racy 2145: the worker stalled right
        after the start-run while the other chain's run was adopted, then aborted with its
        job, which freed the net). Nothing of the product knows the run: the abort stops the
        run its job adopted, and no list is read while the job is ASSIGNED; the claimed job's
        readiness stops it before its submit (revived_runs.stop_before_submit), so the
        server still runs one run at a time (one-run-per-server from then on)."""
        if t - run.submitted_at > self.bounds.unaccounted or not self._later_run_of_another(run):
            return False
        return any(
            str(m.kwargs.get("job_id")) == run.job_id and m.kwargs.get("attempt") == run.attempt
            for m in (*self.sim.broker.pending, *self.sim.current)
        )


def _unseen_end(run: Run, t: float) -> bool:
    """Backend-aware: a Flower run killed with a SuperLink that keeps its state database
    reads as it was (running) until its task's token expires (app.sim.superlink), and the
    SuperLink tells no start time to compare, so nothing can tell the dispatcher it ended
    before then: its settling is bounded from then on. (An NVFLARE run killed with its
    server reads RUNNING for ever, but the server's new start time tells at once.)"""
    return run.expires_at is not None and t < run.expires_at


def _how_ended(run: Run, t: float) -> str:
    if run.aborted_at is not None:
        return f"was aborted at {run.aborted_at:.0f}s"
    if run.killed_at is not None:
        return f"died with its server at {run.killed_at:.0f}s"
    return f"finished {run.status(t)} at {run.end_at:.0f}s"

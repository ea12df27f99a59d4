"""Fault profiles: what can go wrong in a simulated world, and how often.

`FaultProfile()` (every field at its default) is a clean world: messages arrive once and in
time, adapters answer at once and never fail, servers never restart (`CLEAN`, what
`fl-dispatcher simulate` replays with). The bug-hunting sweep's named profiles, which switch
groups of faults on, are the harness's (tests/sim/profiles.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# A human fixes a misconfigured net and restarts the workers this long after faults stop.
HUMAN_FIX_DELAY_S = 300.0


@dataclass(frozen=True)
class FaultProfile:
    """Probabilities are per opportunity (per message, per adapter call, per hook point);
    rates are per net per simulated hour; durations are simulated seconds."""

    name: str = "clean"
    # --- the message layer (Celery + broker) ---
    msg_drop: float = 0.0  # a sent message is lost by the broker
    msg_refuse: float = 0.0  # the broker refuses a send (the outbox reports False)
    msg_dup: float = 0.0  # a message is delivered twice
    msg_delay: float = 0.0  # a message is delayed by up to msg_delay_max_s
    msg_delay_max_s: float = 0.0
    worker_kill: float = 0.0  # per hook point: the worker dies; its message is redelivered
    worker_restart_s: float = 5.0  # redelivery delay of a killed worker's message
    interleave: float = 0.0  # per hook point: another worker runs a due message right now
    retry_backlog: float = 0.0  # per pipeline retry: it runs 30-90 s after its countdown
    broker_outage_p: float = 0.0  # per world: 1-2 broker outages of 5-90 s (app.sim.messages)
    clock_step_p: float = 0.0  # per world: one worker's clock stepped +-1-30 s for 20-180 s
    # per call to a server or a driver: the worker stalls there (a VM pause, a stop-the-world
    # collection, a starved container) for 30 s to stall_max_s, while the other worker, beat
    # and the world go on; then its task resumes where it stopped, past any lease it held
    stall: float = 0.0
    stall_max_s: float = 120.0
    # per pipeline step's LAST try (its retries spent): the worker stalls 30-60 s at
    # its first server or driver call, past the call's timeout, and the call then fails
    # transiently (a submit after the server took it): the retry budget runs out while the
    # job may have moved on meanwhile (reconcile re-sent and adopted the submit, or
    # requeued and re-claimed the job), so the failure handler meets a job it no longer owns
    last_try_stall: float = 0.0
    # per scale call: the platform takes 5 s to twice STUCK_AFTER_S to answer (throttling,
    # the client's own retries and read timeouts: the ECS driver's worst case is minutes),
    # and the call lands only then, while the other worker, beat and the world go on
    slow_scale_call: float = 0.0
    # per statement or commit a handler makes: the database fails it, as PostgreSQL does
    # when it restarts, fails over or resets the connection (tests.sim.dbfaults)
    db_error: float = 0.0
    # --- the NVFLARE admin side ---
    admin_unavailable: float = 0.0  # per call: ServerUnavailable before acting
    admin_unknown: float = 0.0  # per call: UnknownAdminError before acting
    lost_reply: float = 0.0  # submit/abort act on the server, then ServerUnavailable
    lost_reply_partition: float = 0.0  # ...and the network stays broken for a while
    garbled_reply: float = 0.0  # an abort acts on the server, then UnknownAdminError
    admin_latency_max_s: float = 0.0  # every admin call takes up to this long
    submit_latency_max_s: float = 0.0
    no_start_time: float = 0.0  # per server_start_time/is_ready: the server reports none
    no_start_time_at_boot: float = 0.0  # per server start: none reported for its first 5-40 s
    # per submit: the server is killed just before the submit reaches it and is back 1-5 s
    # later, so the retried submit lands on a process readiness never saw
    crash_before_submit: float = 0.0
    poisoned_status: float = 0.0  # per run: job_status never answers (UnknownAdminError)
    # per run: while its net scales to zero, an abort is accepted but it runs on (a hung
    # server job process) until its server goes down; on an always-on net that is an
    # operator's to end, which the sweep cannot play, so there the abort takes
    deaf_run: float = 0.0
    # per run: the server's job runner takes 2-20 s to deploy and start it (DISPATCHED), and
    # an abort accepted meanwhile is overwritten when the runner is done (NVFLARE 2.9 sets
    # RUNNING over FINISHED:ABORTED): the run goes on after "aborted before running it"
    slow_start: float = 0.0
    hung_run: float = 0.0  # per run: NVFLARE reports RUNNING forever
    # per world: the database refuses every write to one job's row for 30-100 s once it is
    # RUNNING, ABORTING or FINISHING (tests.sim.poison); no other row's work may stop for it
    poison_row: float = 0.0
    failed_run: float = 0.0  # per run: FINISHED:EXECUTION_EXCEPTION / ABNORMAL
    # --- the scale driver ---
    driver_transient: float = 0.0  # per call: DriverTransientError before acting
    driver_lost_reply: float = 0.0  # scale acts, then DriverTransientError
    driver_slow: bool = False  # replicas take up to 40 s to start and 20 s to stop
    driver_failure: float = 0.0  # per scale-up: the platform fails the replica
    # --- events on the servers and the deployment (per net per hour) ---
    restart_rate: float = 0.0  # server process killed and restarted
    partition_rate: float = 0.0  # admin port unreachable while the server runs on
    partition_max_s: float = 60.0
    # per always-on net: once it runs a job, its server is unreachable for 90 s-outage_max_s
    # (a host down, a network cut) while the run goes on: the job is lost past the grace,
    # its run kept as a stray no one can settle until the server answers again, and every
    # other net must go on as that job (unclaimable meanwhile) does not exist
    outage_p: float = 0.0
    outage_max_s: float = 240.0
    reply_loss_rate: float = 0.0  # windows of 30-100 s in which every submit loses its reply
    kit_broken_rate: float = 0.0  # AdminMisconfigured until a human fixes it
    driver_broken_rate: float = 0.0  # DriverMisconfigured for a while
    drift_rate: float = 0.0  # someone scales the service by hand (to 0 if up, to 1 if not)
    settings_flip: float = 0.0  # probability of one PER_JOB_FL_SERVER change (a redeploy)
    redeploy_p: float = 0.0  # probability of a NETS change (each of up to two; tests.sim.redeploy)
    # --- flip-api's callback endpoint ---
    # per job and per refused enqueue: flip-api's handler hangs on its events (a locked row,
    # a stuck dependency) from the first post until the faults stop, every post a read
    # timeout, while it answers every other event (app.sim.receiver)
    receiver_hang_p: float = 0.0
    receiver_outages: bool = True  # whole-receiver outages (down, 5xx, 4xx) in a faulty world
    # --- the caller (flip-api) ---
    abort_p: float = 0.0  # per job: an abort at a random moment
    report_p: float = 0.0  # per job: a status report at a random moment

    @property
    def clean(self) -> bool:
        """No fault of any kind (aborts and reports are the caller's business, not faults)."""
        return self == FaultProfile(name=self.name, abort_p=self.abort_p, report_p=self.report_p)

    def quiet(self) -> FaultProfile:
        """The same profile with every per-call fault off (the drain at the end of a run)."""
        return FaultProfile(name=self.name + "/drain", worker_restart_s=self.worker_restart_s)

    def with_(self, **changes: object) -> FaultProfile:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


CLEAN = FaultProfile()

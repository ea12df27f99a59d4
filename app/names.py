"""Every Celery task name and queue, in one place: tasks register under these names, the
outbox, the HTTP API, the CLI and `app.client` send by them, and beat schedules them.

Imports nothing, so `app.client` stays light.
"""

from __future__ import annotations

# Three queues, so that no backlog of one kind of work delays another
# (app/usecases/README.md "Queues"): flip-api's requests (and the assigner's kicks, which
# run after the requests ahead of them), the dispatch chains, and beat's housekeeping, which
# a worker of its own consumes.
QUEUE = "fl_dispatcher"
PIPELINE_QUEUE = "fl_dispatcher.pipeline"
HOUSEKEEPING_QUEUE = "fl_dispatcher.housekeeping"
QUEUES = (QUEUE, PIPELINE_QUEUE, HOUSEKEEPING_QUEUE)
PREFIX = "fl_dispatcher."

# flip-api's public tasks (payloads in app.schemas)
ENQUEUE_JOB = PREFIX + "enqueue_job"
ABORT_JOB = PREFIX + "abort_job"
REPORT_JOB_STATUS = PREFIX + "report_job_status"
# flip-api's hint that a job is coming (app.usecases.prewarm), and its cancel
PREWARM = PREFIX + "prewarm"
CANCEL_PREWARM = PREFIX + "cancel_prewarm"

# the dispatch chain
ASSIGN_NEXT_JOB = PREFIX + "assign_next_job"
SCALE_UP = PREFIX + "scale_up"
WAIT_READY = PREFIX + "wait_ready"
DISPATCH = PREFIX + "dispatch"
ABORT_ON_SERVER = PREFIX + "abort_on_server"
SETTLE_STRAY_RUNS = PREFIX + "settle_stray_runs"
# brings a prewarmed net's server up and marks it READY once it is (no job holds it)
WARM_UP = PREFIX + "warm_up"

# beat's housekeeping
SCALE_DOWN_IDLE_NETS = PREFIX + "scale_down_idle_nets"
KEEP_ALIVE_BUSY_NETS = PREFIX + "keep_alive_busy_nets"
MONITOR_RUNNING_JOBS = PREFIX + "monitor_running_jobs"
MONITOR_AWAITED_RUNS = PREFIX + "monitor_awaited_runs"
RECONCILE = PREFIX + "reconcile"

# job status pushed to flip-api (after every commit that moved a job, and beat's sweep)
DELIVER_CALLBACKS = PREFIX + "deliver_callbacks"

# Where a task goes when beat does not send it (beat sends everything it schedules to
# HOUSEKEEPING_QUEUE); any other task goes to QUEUE. The assigner's kick stays there: a
# kick sent during a burst runs once the requests ahead of it are stored, so one assign
# round claims for all of them.
ROUTES: dict[str, str] = {
    **dict.fromkeys(
        (
            SCALE_UP,
            WAIT_READY,
            DISPATCH,
            ABORT_ON_SERVER,
            SETTLE_STRAY_RUNS,
            DELIVER_CALLBACKS,
            WARM_UP,
        ),
        PIPELINE_QUEUE,
    ),
    **dict.fromkeys(
        (
            SCALE_DOWN_IDLE_NETS,
            KEEP_ALIVE_BUSY_NETS,
            MONITOR_RUNNING_JOBS,
            MONITOR_AWAITED_RUNS,
            RECONCILE,
        ),
        HOUSEKEEPING_QUEUE,
    ),
}


def queue_for(task: str) -> str:
    """The queue a task is sent to outside beat's schedule."""
    return ROUTES.get(task, QUEUE)

"""Every Celery task name and the queue, in one place: tasks register under these names,
the outbox, the HTTP API, the CLI and `app.client` send by them, and beat schedules them.

Imports nothing, so `app.client` stays light.
"""

from __future__ import annotations

QUEUE = "fl_dispatcher"
PREFIX = "fl_dispatcher."

# flip-api's public tasks (payloads in app.schemas)
ENQUEUE_JOB = PREFIX + "enqueue_job"
ABORT_JOB = PREFIX + "abort_job"
REPORT_JOB_STATUS = PREFIX + "report_job_status"

# the dispatch chain
ASSIGN_NEXT_JOB = PREFIX + "assign_next_job"
SCALE_UP = PREFIX + "scale_up"
WAIT_READY = PREFIX + "wait_ready"
DISPATCH = PREFIX + "dispatch"
ABORT_ON_SERVER = PREFIX + "abort_on_server"
SETTLE_STRAY_RUNS = PREFIX + "settle_stray_runs"

# beat's housekeeping
SCALE_DOWN_IDLE_NETS = PREFIX + "scale_down_idle_nets"
KEEP_ALIVE_BUSY_NETS = PREFIX + "keep_alive_busy_nets"
MONITOR_RUNNING_JOBS = PREFIX + "monitor_running_jobs"
MONITOR_AWAITED_RUNS = PREFIX + "monitor_awaited_runs"
RECONCILE = PREFIX + "reconcile"

# job status pushed to flip-api (after every commit that moved a job, and beat's sweep)
DELIVER_CALLBACKS = PREFIX + "deliver_callbacks"

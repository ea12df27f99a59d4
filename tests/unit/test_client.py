"""flip-api's client: light to import, and it sends what the public tasks accept."""

from __future__ import annotations

import json
import subprocess
import sys

from app import names
from app.client import DispatcherClient
from app.schemas import EnqueueJob, ReportedStatus, job_id_for

# What a caller must not have to install or load to send a job: the database stack, NVFLARE,
# the HTTP stack, AWS, and this project's settings, models and worker code.
HEAVY = (
    "sqlalchemy",
    "nvflare",
    "fastapi",
    "starlette",
    "psycopg",
    "boto3",
    "pydantic_settings",
    "models",
    "tasks",
    "app.settings",
    "app.db",
    "app.runtime",
)

USE_THE_CLIENT = """
import json, sys
from app.client import DispatcherClient
from app.schemas import EnqueueJob, ReportedStatus
client = DispatcherClient("memory://")
job_id = client.enqueue_job(EnqueueJob(caller_key="k-light", definition="d", net="net-1"))
client.abort_job(job_id)
client.report_job_status(job_id, ReportedStatus.STOPPED)
client.close()
heavy = json.loads(sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m in heavy or m.split(".")[0] in heavy)))
"""


def test_importing_and_using_the_client_loads_nothing_heavy():
    done = subprocess.run(
        [sys.executable, "-c", USE_THE_CLIENT, json.dumps(HEAVY)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(done.stdout) == []


def test_the_client_sends_the_public_tasks_to_the_workers_queue():
    client = DispatcherClient("memory://")
    request = EnqueueJob(caller_key="k-1", definition="fedavg", net="net-1", priority=5)
    job_id = client.enqueue_job(request)
    assert job_id == job_id_for("k-1")
    client.abort_job(job_id, reason="not needed")
    client.report_job_status(job_id, ReportedStatus.RESULTS_UPLOADED, "s3://out")
    sent = []
    with client.app.connection_for_read() as conn:
        queue = conn.SimpleQueue(names.QUEUE)
        for _ in range(3):
            message = queue.get(timeout=1)
            sent.append((message.headers["task"], message.payload[1]))
            message.ack()
        queue.close()
    client.close()
    assert sent == [
        # A job naming no prewarm nor project is sent without those fields, so older workers
        # take it.
        (
            names.ENQUEUE_JOB,
            {"payload": request.model_dump(mode="json", exclude={"prewarm_key", "project_id"})},
        ),
        (names.ABORT_JOB, {"payload": {"job_id": str(job_id), "reason": "not needed"}}),
        (
            names.REPORT_JOB_STATUS,
            {
                "payload": {
                    "job_id": str(job_id),
                    "status": "results_uploaded",
                    "detail": "s3://out",
                }
            },
        ),
    ]

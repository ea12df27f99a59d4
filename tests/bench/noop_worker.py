"""The burst benchmark's ceiling (`bench_burst --ceiling`): a Celery worker with the
dispatcher's own configuration (`app.celery_app.celery_config`: the Redis transport, late
acks, prefetch 1, task events for Celery Flower) whose enqueue task only counts itself. Its
rate is what Celery alone moves on this machine, the bound of any enqueue task's intake.

    celery -A tests.bench.noop_worker worker -Q fl_dispatcher   (the burst stack's env)
"""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import Celery

from app import names
from app.celery_app import celery_config
from app.settings import Settings
from tests.fixtures.burst import NOOP_COUNT_KEY, NOOP_LAST_KEY

_settings = Settings()
app = Celery("noop-dispatcher")
app.conf.update(celery_config(_settings) | {"beat_schedule": {}})
_counts = redis.Redis.from_url(_settings.broker_url)


@app.task(name=names.ENQUEUE_JOB)
def enqueue_job(payload: Any = None) -> None:
    """Count the message and when it ran: one pipelined round trip, nothing else."""
    pipe = _counts.pipeline()
    pipe.incr(NOOP_COUNT_KEY)
    pipe.set(NOOP_LAST_KEY, time.time())
    pipe.execute()

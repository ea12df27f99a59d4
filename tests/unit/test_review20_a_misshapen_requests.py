"""Review round 20 (A): a request sent by name in another shape than one `payload` kwarg is
acknowledged away with a TypeError traceback, leaving neither a job nor a recorded refusal.

tasks/README.md: "A refused payload (...) creates no job: it is logged as one line and
recorded for REJECTED_RETENTION_S, so GET /jobs/{id} and the CLI answer "rejected: <reason>"
instead of "not found", and with CALLBACK_URL set it is pushed as a `rejected` event". flip-api
sends the tasks by name (`send_task`), where `kwargs=payload` instead of
`kwargs={"payload": payload}`, or `args=[payload]`, is the likeliest slip of a caller that
does not use `app.client`: the handler's call raises TypeError, which `on_error` judges
FAILED, and Celery acknowledges the message: no trace but a traceback in the worker log,
and flip-api waits for a job or a `rejected` event that never comes.
"""

from __future__ import annotations

from typing import Any

import pytest

from app import names
from app.schemas import job_id_for
from app.usecases import enqueue
from tasks import base
from tasks.registered import TASKS

FIELDS = {"caller_key": "flat-1", "definition": "tiny-job", "net": "net-a"}


@pytest.fixture
def rt(world):
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


def _refusal(world: Any) -> Any:
    with world.rt.sessions() as session:
        return enqueue.get_rejection(session, job_id_for(FIELDS["caller_key"]))


def test_an_enqueue_sent_with_its_fields_as_the_kwargs_is_a_recorded_refusal(rt):
    answer = TASKS[names.ENQUEUE_JOB].run(**FIELDS)  # raises TypeError today
    assert "rejected" in answer and _refusal(rt) is not None


def test_an_enqueue_sent_with_its_payload_as_a_positional_argument_is_a_recorded_refusal(rt):
    answer = TASKS[names.ENQUEUE_JOB].run(FIELDS)  # raises TypeError today
    assert "rejected" in answer and _refusal(rt) is not None


def test_an_enqueue_whose_caller_key_is_a_json_number_is_refused_under_that_key(rt):
    """A by-name caller whose run ids are numbers sends `"caller_key": 42`. The model refuses
    it (a string is required), but `caller_key_of` drops a key that is no string, so the
    refusal is recorded with no key and no job id, and the `rejected` event carries
    `caller_key: null, job_id: null`: flip-api cannot tie it to its request, and
    GET /jobs/{uuid5(ns, "42")} answers "not found" for good."""
    answer = TASKS[names.ENQUEUE_JOB].run(payload={**FIELDS, "caller_key": 42})
    assert "rejected" in answer
    assert answer["caller_key"] == "42", answer
    with rt.rt.sessions() as session:
        assert enqueue.get_rejection(session, job_id_for("42")) is not None

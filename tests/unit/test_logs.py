"""Log lines: JSON with the extra keys, plain with key=value, and never a secret."""

from __future__ import annotations

import io
import json
import logging

import pytest

from app import names
from app.errors import SettingsError
from app.logs import configure_logging
from app.settings import Settings

SECRET = "api-secret-0d9e-4c1a"
FLOWER_PW = "fl0wer-pw"
DB_PW = "db-pw-77"


@pytest.fixture
def log_to(tmp_path):
    """configure_logging into a buffer; the handler is removed afterwards."""
    installed = []

    def configure(**env) -> io.StringIO:
        settings = Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path,
            API_SECRET=SECRET,
            FLOWER_BASIC_AUTH=f"admin:{FLOWER_PW}",
            DATABASE_URL=f"postgresql+psycopg://fl:{DB_PW}@db/fl",
            **env,
        )
        buffer = io.StringIO()
        installed.append(configure_logging(settings, stream=buffer))
        return buffer

    yield configure
    for handler in installed:
        logging.getLogger().removeHandler(handler)


def test_json_lines_carry_the_extra_keys(log_to):
    buffer = log_to(LOG_JSON="true")
    logging.getLogger("app.usecases.records").info(
        "job %s requeued", "j-1", extra={"net": "net-a", "job": "j-1", "reason": "server lost"}
    )
    line = json.loads(buffer.getvalue())
    assert line["message"] == "job j-1 requeued"
    assert line["level"] == "INFO" and line["logger"] == "app.usecases.records"
    assert (line["net"], line["job"], line["reason"]) == ("net-a", "j-1", "server lost")
    assert line["ts"].endswith("+00:00")


def test_json_lines_include_the_exception(log_to):
    buffer = log_to(LOG_JSON="1")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("x").exception("failed", extra={"net": "net-b"})
    line = json.loads(buffer.getvalue())
    assert "RuntimeError: boom" in line["exc"] and line["net"] == "net-b"


def test_plain_lines_show_extras_as_key_value(log_to):
    buffer = log_to()
    logging.getLogger("x").warning("net down", extra={"net": "net-a", "state": "OUTAGE"})
    text = buffer.getvalue()
    assert "WARNING" in text and "net down [net=net-a state=OUTAGE]" in text


@pytest.mark.parametrize("json_lines", ["true", "false"])
def test_secrets_never_reach_a_log_line(log_to, json_lines):
    buffer = log_to(LOG_JSON=json_lines)
    log = logging.getLogger("x")
    log.info("key is %s", SECRET)
    log.info("flower auth admin:%s", FLOWER_PW)
    log.info("connecting to postgresql://fl:%s@db/fl", DB_PW)
    log.info("redis at redis://:hunter2@redis:6379/0")
    log.info("request", extra={"api_key": "whatever-it-is", "detail": f"token={SECRET}"})
    try:
        raise ValueError(f"bad secret {SECRET}")
    except ValueError:
        log.exception("failed")
    text = buffer.getvalue()
    for secret in (SECRET, FLOWER_PW, DB_PW, "hunter2", "whatever-it-is"):
        assert secret not in text
    assert "***" in text
    assert "postgresql://fl:***@db/fl" in text


def test_a_url_password_is_masked_decoded_and_as_written(log_to):
    buffer = log_to(
        CALLBACK_URL="https://flip:cb%40pw-9@flip-api/cb",
        CALLBACK_SECRET="callback-secret-0123456789",
    )
    log = logging.getLogger("x")
    log.info("the client sends cb@pw-9")
    log.info("the setting says cb%40pw-9")
    text = buffer.getvalue()
    assert "cb@pw-9" not in text and "cb%40pw-9" not in text
    assert text.count("***") == 2


def test_submit_token_is_not_mistaken_for_a_secret(log_to):
    buffer = log_to(LOG_JSON="true")
    logging.getLogger("x").info("submitting", extra={"submit_token": "job-1-0"})
    assert json.loads(buffer.getvalue())["submit_token"] == "job-1-0"


def test_level_is_applied_and_a_bad_level_is_a_settings_error(log_to):
    buffer = log_to(LOG_LEVEL="warning")
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    assert "hidden" not in buffer.getvalue() and "shown" in buffer.getvalue()
    with pytest.raises(SettingsError, match="LOG_LEVEL='loud'"):
        log_to(LOG_LEVEL="loud")


def test_configuring_twice_keeps_one_handler(log_to):
    log_to()
    log_to()
    mine = [h for h in logging.getLogger().handlers if h.get_name() == "fl-dispatcher"]
    assert len(mine) == 1


@pytest.fixture
def throwaway_celery():
    from celery import Celery

    app = Celery("log-test", set_as_current=False)
    yield app
    app.close()


@pytest.mark.parametrize("json_lines", ["true", "false"])
def test_lines_inside_a_celery_task_carry_its_id_and_name(log_to, throwaway_celery, json_lines):
    buffer = log_to(LOG_JSON=json_lines)
    log = logging.getLogger("app.usecases.dispatch")

    @throwaway_celery.task(name="log_test.probe", shared=False)  # not on the shared app
    def probe() -> None:
        log.info("inside the task", extra={"net": "net-a"})

    log.info("before the task")
    probe.apply(task_id="6f1c2b9e-task-id")
    log.info("after the task")
    lines = buffer.getvalue().splitlines()
    ours = [line for line in lines if "app.usecases.dispatch" in line]
    # Celery's own line about the outcome, written as the task ends, is tied to it too.
    (outcome,) = [line for line in lines if "celery.app.trace" in line]
    assert len(ours) == 3 and "succeeded" in outcome
    if json_lines == "true":
        before, inside, after = (json.loads(line) for line in ours)
        for line in (inside, json.loads(outcome)):
            assert (line["task_id"], line["task_name"]) == (
                "6f1c2b9e-task-id",
                "log_test.probe",
            )
        assert inside["net"] == "net-a"
        assert "task_id" not in before and "task_name" not in before
        assert "task_id" not in after and "task_name" not in after
    else:
        before, inside, after = ours
        for line in (inside, outcome):
            assert "task_id=6f1c2b9e-task-id" in line
            assert "task_name=log_test.probe" in line
        assert "task_" not in before and "task_" not in after


def test_a_project_task_logs_with_its_id(log_to, world):
    # A real public task, run by Celery (apply), logging from deep inside its use case.
    from app import names
    from tasks import base
    from tasks.registered import TASKS

    buffer = log_to(LOG_JSON="true")
    base.set_runtime(world.rt)
    try:
        TASKS[names.ENQUEUE_JOB].apply(
            kwargs={"payload": {"caller_key": "log-1", "definition": "tiny-job", "net": "net-a"}},
            task_id="enqueue-task-1",
        )
    finally:
        base.set_runtime(None)
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    enqueued = [line for line in lines if line["message"] == "job enqueued"]
    assert len(enqueued) == 1
    assert enqueued[0]["task_id"] == "enqueue-task-1"
    assert enqueued[0]["task_name"] == names.ENQUEUE_JOB
    assert enqueued[0]["caller_key"] == "log-1"


def test_celerys_routine_lines_about_the_once_a_second_poll_are_left_out(log_to, throwaway_celery):
    buffer = log_to()
    own = logging.getLogger("app.usecases.housekeeping")

    @throwaway_celery.task(name=names.MONITOR_AWAITED_RUNS, shared=False)
    def poll() -> None:
        own.info("run settled")

    poll.apply(task_id="poll-id")
    beat = logging.getLogger("celery.beat")
    beat.info("Scheduler: Sending due task %s (%s)", "monitor-awaited-runs", poll.name)
    beat.info("Scheduler: Sending due task %s (%s)", "reconcile", names.RECONCILE)
    request = logging.getLogger("celery.worker.request")
    request.info("Discarding revoked task: %s[%s]", poll.name, "poll-id")
    request.warning("Task %s[%s] odd", poll.name, "poll-id")
    lines = buffer.getvalue().splitlines()
    assert any("run settled" in line for line in lines)
    assert not any("succeeded" in line for line in lines)  # Celery's line for the poll
    assert not any("monitor-awaited-runs" in line for line in lines)
    assert not any("Discarding" in line for line in lines)
    assert any(names.RECONCILE in line for line in lines)
    assert any("odd" in line for line in lines)  # a warning about it is never dropped

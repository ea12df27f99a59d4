"""Log lines: JSON with the extra keys, plain with key=value, and never a secret."""

from __future__ import annotations

import io
import json
import logging

import pytest

from app.errors import SettingsError
from app.logs import configure_logging
from app.settings import Settings

SECRET = "api-secret-0d9e"
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
    logging.getLogger("app.usecases.services").info(
        "job %s requeued", "j-1", extra={"net": "net-a", "job": "j-1", "reason": "server lost"}
    )
    line = json.loads(buffer.getvalue())
    assert line["message"] == "job j-1 requeued"
    assert line["level"] == "INFO" and line["logger"] == "app.usecases.services"
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

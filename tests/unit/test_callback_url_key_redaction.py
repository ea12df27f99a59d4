"""A receiver's key in CALLBACK_URL's query is masked wherever the URL is shown: `config
check` and log lines, as a password in the query is.

Promise (README.md "Configuration essentials"): "`fl-dispatcher config check` validates
them all and prints the effective configuration, secrets redacted"; app/redact.py
`secret_parameter` names the query parameters that carry a secret.

Scenario: flip-api's status endpoint sits behind a gateway that takes its key in the query,
as webhook receivers commonly do: `?api_key=` / `?apikey=` (API gateways), `?code=` (Azure
Functions' function key), `?sig=` (a SAS signature). Only names ending in password, passwd,
token or secret were masked, so `config check --json` (pasted into a ticket) and a log line
quoting the URL showed that key: whoever read them could post to flip-api's endpoint past
its gateway (the HMAC still protects the payload, but the gateway's key is the receiver's
first line). A parameter that is no secret and that an operator needs, flip-api's
`caller_key` in the status API's access lines, stays readable.
"""

from __future__ import annotations

import io
import logging

import pytest

from app.logs import configure_logging
from app.redact import redact_text, secret_parameter
from app.settings import Settings

KEY = "rcv-key-51a9c07e"
KEY_NAMES = ["api_key", "apikey", "code", "sig", "x-functions-key", "X-Amz-Signature"]
KEY_NAMES += ["access_key", "signature", "auth", "credential", "Sig", "%61pi_key", "key"]


def _settings(tmp_path, name: str) -> Settings:
    return Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        CALLBACK_URL=f"https://flip-api.internal/fl/callbacks?ts=1&{name}={KEY}",
        CALLBACK_SECRET="a-callback-secret-0123456789",
    )


@pytest.mark.parametrize("name", KEY_NAMES)
def test_config_check_masks_a_receiver_key_in_the_callback_urls_query(name, tmp_path):
    shown = _settings(tmp_path, name).redacted()["CALLBACK_URL"]
    assert KEY not in shown, f"config check prints CALLBACK_URL as {shown}"
    assert f"?ts=1&{name}=***" in shown


@pytest.mark.parametrize("name", ["api_key", "code", "sig"])
def test_a_log_line_masks_a_receiver_key_quoted_with_or_without_its_url(name, tmp_path):
    settings = _settings(tmp_path, name)
    stream = io.StringIO()
    handler = configure_logging(settings, stream=stream)
    try:
        log = logging.getLogger("a-worker")
        log.error("cannot reach %s (took %s)", settings.callback_url, "3 s")
        log.error("the receiver's key was %s", KEY)
    finally:
        logging.getLogger().removeHandler(handler)
    lines = stream.getvalue()
    assert KEY not in lines, lines
    assert "(took 3 s)" in lines


@pytest.mark.parametrize("name", ["caller_key", "reason_code", "net", "page", "sslkey"])
def test_a_parameter_that_is_no_secret_is_left_readable(name):
    """caller_key is flip-api's idempotency key, logged on purpose in the status API's access
    lines; reason_code only ends in `code`; sslkey is libpq's path of a key file."""
    assert not secret_parameter(name)
    line = f'10.0.0.7:51234 - "GET /jobs?{name}=flip-run-42 HTTP/1.1" 200'
    assert redact_text(line) == line

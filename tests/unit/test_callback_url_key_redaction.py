"""Review b: a CALLBACK_URL that carries its receiver's key in the query is printed whole.

Promise (README.md "Configuration essentials"): "`fl-dispatcher config check` validates
them all and prints the effective configuration, secrets redacted"; app/redact.py masks a
query's "password-like parameters", but only names ending in password, passwd, token or
secret.

Scenario: flip-api's status endpoint sits behind a gateway that takes its key in the query,
as webhook receivers commonly do: `?api_key=` / `?apikey=` (API gateways), `?code=` (Azure
Functions' function key), `?sig=` (a SAS signature). `config check --json` (pasted into a
ticket) shows that key as it is (and the log filter's list of secrets, app/logs.py
`secret_values`, takes the same names, so a line quoting the URL would too), so whoever reads
them can post forged status to flip-api's endpoint (the HMAC still protects the payload,
but the gateway's key is the receiver's first line).
"""

from __future__ import annotations

import pytest

from app.settings import Settings

KEY = "rcv-key-51a9c07e"


@pytest.mark.parametrize("name", ["api_key", "apikey", "code", "sig"])
def test_config_check_masks_a_receiver_key_in_the_callback_urls_query(name, tmp_path):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        CALLBACK_URL=f"https://flip-api.internal/fl/callbacks?{name}={KEY}",
        CALLBACK_SECRET="a-callback-secret-0123456789",
    )
    shown = settings.redacted()["CALLBACK_URL"]
    assert KEY not in shown, f"config check prints CALLBACK_URL as {shown}"

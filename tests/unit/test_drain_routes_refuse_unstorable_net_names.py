"""POST /drain and POST /undrain refuse a net name holding a lone surrogate (valid JSON:
"\\ud800") with a 422 naming the field, as every door refuses text PostgreSQL cannot hold,
and never with a bare 500 (the routes promise 400 or 422 for a bad body)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.entrypoints.api import create_app
from tests.unit.test_drain import AUTH, two  # noqa: F401 (two: a fixture)

BODY = b'{"nets": ["\\ud800"]}'  # JSON's escape for a lone surrogate


@pytest.mark.parametrize("route", ["/drain", "/undrain"])
def test_a_lone_surrogate_net_name_is_a_clear_4xx_not_a_500(two, route):  # noqa: F811
    with TestClient(create_app(two.rt), raise_server_exceptions=False) as client:
        answer = client.post(
            route, content=BODY, headers={**AUTH, "content-type": "application/json"}
        )
    assert answer.status_code in (400, 422), (answer.status_code, answer.text[:200])
    assert "detail" in answer.json()


def test_a_refusal_quoting_text_utf8_cannot_encode_is_still_sent():
    """Every route's refusal goes through `api_errors.error`: a message that quotes what the
    caller sent is escaped where UTF-8 cannot hold it, so the refusal itself is no 500."""
    from app.entrypoints.api_errors import error

    answer = error(400, "unknown net(s) \ud800")
    assert answer.status_code == 400
    assert b"unknown net(s) \\\\ud800" in answer.body

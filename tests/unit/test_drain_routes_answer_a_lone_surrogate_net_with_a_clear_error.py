"""POST /drain and POST /undrain name nets as plain strings (drain_routes.UndrainBody.nets:
`list[str]`, where the drain's reason is `StorableText`): a net name holding a lone
surrogate (valid JSON: "\\ud800") reaches `drains.drain`, whose InvalidRequest ("unknown
net(s) ...") echoes it, and the error handler cannot encode that message as UTF-8: the
caller gets a bare 500 "Internal Server Error" and a traceback in the log, where every other
door answers such text with a 4xx naming the field (POST /prewarms' required_sites: 422
"holds a lone surrogate (not UTF-8): it cannot be stored or sent"). The routes promise 400
or 422 for a bad body (`error_responses(400, 401, 403, 413, 422, 503)`)."""

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

"""GET /jobs pages by a cursor (app.usecases.views.page_jobs): a cursor this API did not
return is refused as a bad request (400), never a crash. The pages over HTTP, each job once:
tests/integration/test_api_contract.py."""

from __future__ import annotations

import base64
import uuid

import pytest

from app.errors import InvalidRequest
from app.usecases import views


def test_a_crafted_cursor_without_a_zone_is_a_400_not_a_crash(world) -> None:
    """Scenario: GET /jobs?cursor=<base64 of '2026-01-01T00:00:00|<uuid>'> (no zone offset).
    Promise (cursor pagination, app/usecases/views.py): a cursor this API did not return is
    InvalidRequest (400); here the naive datetime reaches UTCDateTime's bind and raises
    (StatementError -> 500)."""
    world.enqueue("k-page", net="net-a")
    raw = f"2026-01-01T00:00:00|{uuid.uuid4()}"
    cursor = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    with world.rt.sessions() as session, pytest.raises(InvalidRequest):
        views.page_jobs(session, None, 10, cursor=cursor)

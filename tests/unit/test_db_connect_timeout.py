"""A PostgreSQL host that takes the connection and never answers (a blackholed host behind
a load balancer, a server hung in its startup) must not hold a worker for as long as the
operating system's TCP timers allow (minutes): every process's engine gives up after
`db.CONNECT_TIMEOUT_S` unless the URL names its own `connect_timeout`."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app import db

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture
def silent_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A port whose listener completes TCP handshakes and then says nothing."""
    monkeypatch.setattr(db, "CONNECT_TIMEOUT_S", 2)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def test_a_server_that_never_answers_fails_the_connection(silent_port: int) -> None:
    engine = db.make_engine(f"postgresql+psycopg://fl@127.0.0.1:{silent_port}/fl")
    # On 64a10e1: no timeout, the connect waits on the silent server until pytest's guard.
    with pytest.raises(OperationalError), engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    engine.dispose()


def test_a_url_s_own_connect_timeout_is_kept(silent_port: int) -> None:
    url = f"postgresql+psycopg://fl@127.0.0.1:{silent_port}/fl?connect_timeout=1"
    engine = db.make_engine(url)
    assert engine.dialect.create_connect_args(engine.url)[1]["connect_timeout"] == "1"
    assert "connect_timeout" not in db.connect_args(url)
    engine.dispose()

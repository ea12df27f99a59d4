"""The local stack's net rows, made before its worker boots (app.local.stack): rows only,
never the worker start's reset of a MISCONFIGURED net, which only a start that has checked
the net's files may do. The stack's database may be one other workers share
(`--database-url`), where such a reset would put a net whose kit names another server back
in service until the stack's own worker had booted."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select

from app.db import make_engine, session_factory, unit_of_work
from app.local.stack import declare_net_rows
from app.settings import Settings
from app.usecases.declared_nets import sync_nets
from models import Net, NetState


def _on(settings: Settings, url: str) -> Settings:
    """The fixture's two nets, on the test's own database."""
    return settings.model_copy(update={"database_url": url})


def test_the_stacks_rows_leave_a_misconfigured_net_out_of_service(settings, sqlite_url):
    settings = _on(settings, sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    now = datetime(2026, 12, 5, tzinfo=UTC)
    with unit_of_work(sessions) as session:
        sync_nets(session, settings, now)
        net = session.scalar(select(Net).where(Net.name == "net-a"))
        assert net is not None
        net.transition(NetState.MISCONFIGURED, now, "kit names another server")
        net.last_error = "kit names another server"

    declare_net_rows(settings)

    with sessions() as session:
        states = {name: state for name, state in session.execute(select(Net.name, Net.state))}
        error = session.scalar(select(Net.last_error).where(Net.name == "net-a"))
    assert states == {"net-a": NetState.MISCONFIGURED, "net-b": NetState.STOPPED}
    assert error == "kit names another server"


def test_the_stacks_rows_are_made_before_any_worker(settings, sqlite_url):
    declare_net_rows(_on(settings, sqlite_url))
    with session_factory(make_engine(sqlite_url))() as session:
        assert set(session.scalars(select(Net.name))) == {"net-a", "net-b"}

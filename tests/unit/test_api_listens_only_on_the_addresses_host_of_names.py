"""`fl-dispatcher api --host-of NAME`: the api listens on this machine's own address that
NAME resolves to, and on no other (app/entrypoints/listen_address.py).

compose's api is on three networks and must answer on the default one only (review b:
tests/unit/test_compose_job_code_reads_the_api.py); a network alias on that network names
its address there. With replicas an alias names every replica's address: the own one is
taken. A name that names none of this machine's addresses is an error line at start, before
any wait: never a fallback to listening everywhere. Repeated, it listens on each name's
address (compose.flip.yml: the default network and FLIP's).
"""

from __future__ import annotations

import socket

import pytest
import uvicorn

from app.entrypoints.cli import main
from app.entrypoints.listen_address import ListenAddressError, own_address_of
from tests.fixtures.services import free_port
from tests.unit.test_cli import _isolated_logging, cli_env, db  # noqa: F401

NOT_OURS = "192.0.2.7"  # TEST-NET-1: no machine's own address


@pytest.fixture
def names(monkeypatch):
    """Host names as the engine's DNS would answer them, here."""
    table = {
        "api-listener": [NOT_OURS, "127.0.0.1"],  # another replica's first
        "flip-alias": ["127.0.0.2"],  # all of 127/8 is loopback's on Linux
        "elsewhere": [NOT_OURS],
    }
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in table:
            return real(host, port, *args, **kwargs)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port or 0))
            for address in table[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


@pytest.fixture
def served(monkeypatch):
    """What uvicorn would serve on: the host it binds, or the sockets handed to it."""
    seen: dict[str, object] = {}

    def run(app, host, port, log_config):
        seen["host"] = (host, port)

    def server_run(self, sockets=None):
        seen["sockets"] = [sock.getsockname() for sock in sockets or []]
        for sock in sockets or []:
            sock.close()

    monkeypatch.setattr(uvicorn, "run", run)
    monkeypatch.setattr(uvicorn.Server, "run", server_run)
    return seen


def test_the_name_s_own_address_is_taken_not_another_replica_s(names):
    assert own_address_of("api-listener") == "127.0.0.1"


def test_a_name_that_names_no_own_address_is_an_error(names):
    with pytest.raises(ListenAddressError, match=f"--host-of elsewhere: .*{NOT_OURS}.*none"):
        own_address_of("elsewhere")


def test_the_api_binds_the_address_of_its_name_only(capsys, db, names, served):  # noqa: F811
    port = free_port()
    assert main(["api", "--host-of", "api-listener", "--port", str(port)]) == 0
    assert served == {"host": ("127.0.0.1", port)}


def test_repeated_the_api_listens_on_each_name_s_address(capsys, db, names, served):  # noqa: F811
    port = free_port()
    argv = ["api", "--host-of", "api-listener", "--host-of", "flip-alias", "--port", str(port)]
    assert main(argv) == 0
    assert served == {"sockets": [("127.0.0.1", port), ("127.0.0.2", port)]}


@pytest.mark.parametrize("name", ["elsewhere", "no-such-host.invalid"])
def test_a_name_without_an_own_address_stops_the_api_before_it_waits(
    capsys,
    db,  # noqa: F811
    names,
    served,
    monkeypatch,
    name: str,
):
    def no_wait(*args, **kwargs):
        raise AssertionError("waited for the dependencies first")

    monkeypatch.setattr("app.readiness.wait_for_dependencies", no_wait)
    assert main(["api", "--host-of", name, "--wait", "300"]) == 1
    err = capsys.readouterr().err
    assert f"fl-dispatcher: --host-of {name}: " in err and "Traceback" not in err
    assert served == {}


def test_host_and_host_of_together_are_refused(capsys, db):  # noqa: F811
    with pytest.raises(SystemExit) as refused:
        main(["api", "--host", "0.0.0.0", "--host-of", "api-listener"])
    assert refused.value.code == 2
    assert "not allowed with" in capsys.readouterr().err

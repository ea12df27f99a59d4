"""The Flower test CA and SuperNode keys (`app.local.flower`). The SuperLink's certificate
names every host its clients dial: on one machine 127.0.0.1; in compose.yml's `flower-net`
profile the SuperNodes and the dispatcher dial the service's name, `superlink`, and the
SuperLink's own SuperExec 127.0.0.1."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from app.local.flower import Tls, make_supernode_key, make_tls


def handshake(tls: Tls, server_hostname: str) -> None:
    """A TLS handshake on loopback with the CA's client context checking `server_hostname`."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls.cert, tls.key)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept() -> None:
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass  # the client refused the certificate

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            tls.context().wrap_socket(raw, server_hostname=server_hostname),
        ):
            pass
        thread.join(5)


def test_the_default_certificate_names_loopback_only(tmp_path: Path):
    tls = make_tls(tmp_path)
    handshake(tls, "127.0.0.1")
    handshake(tls, "localhost")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tls, "superlink")


def test_a_certificate_for_compose_names_the_service_and_loopback(tmp_path: Path):
    """The SuperNodes and the dispatcher dial `superlink`; the SuperLink's own SuperExec dials
    its port on 127.0.0.1 with the same CA (seen in the compose stack: without it no
    ServerApp ever starts)."""
    tls = make_tls(tmp_path, hosts=("superlink", "127.0.0.1"))
    handshake(tls, "superlink")
    handshake(tls, "127.0.0.1")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tls, "fl-server")


def test_a_supernode_key_pair_is_written_as_ssh_keygen_writes_one(tmp_path: Path):
    """The private key flower-supernode reads, and beside it the OpenSSH public key
    `flwr supernode register` reads (compose.yml's SuperNodes are registered with it)."""
    from cryptography.hazmat.primitives import serialization

    path, public = make_supernode_key(tmp_path, "site-1")
    private = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    ssh_public = serialization.load_ssh_public_key(path.with_name("site-1.pub").read_bytes())
    pem = serialization.Encoding.PEM
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    assert (
        ssh_public.public_bytes(pem, spki) == public == private.public_key().public_bytes(pem, spki)
    )

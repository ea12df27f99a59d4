"""A local Flower net's certificate checked at a worker's start and by `config check`
(`flower_endpoint_problem`): a net whose SuperLink the Control API client would accept
must not be taken out of service (MISCONFIGURED at every worker start), and one it would
refuse must be. What the client accepts is asked of it: a TLS handshake on loopback with
the net's own files, as `FlowerControlClient` makes it (the CA file, the address's host)."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.adapters.flower.files_check import flower_endpoint_problem
from app.net_config import parse_nets
from app.settings import Settings
from tests.unit.test_flower_nets import fake_venv

NOW = datetime.datetime.now(datetime.UTC)
PEM = serialization.Encoding.PEM


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool,
    names: tuple[str, ...] = (),
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(minutes=5))
        .not_valid_after(NOW + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        sans: list[x509.GeneralName] = []
        for n in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                sans.append(x509.DNSName(n))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _files(folder: Path, names: tuple[str, ...], *, intermediate: bool) -> tuple[Path, ...]:
    """(CA file, certificate file with its chain, key file) for a SuperLink named `names`."""
    folder.mkdir(parents=True, exist_ok=True)
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = _cert("root CA", root_key, None, ca=True)
    issuer, chain = (root, root_key), []
    if intermediate:
        mid_key = ec.generate_private_key(ec.SECP256R1())
        mid = _cert("intermediate CA", mid_key, issuer, ca=True)
        issuer, chain = (mid, mid_key), [mid]
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _cert("superlink", key, issuer, ca=False, names=names)
    ca, cert, key_file = folder / "ca.pem", folder / "superlink.pem", folder / "superlink.key"
    ca.write_bytes(root.public_bytes(PEM))
    cert.write_bytes(b"".join(c.public_bytes(PEM) for c in [leaf, *chain]))
    key_file.write_bytes(
        key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca, cert, key_file


def _client_accepts(ca: Path, cert: Path, key: Path, host: str) -> bool:
    """A TLS handshake on loopback: the server presents `cert`, the client trusts `ca` and
    dials `host` (the Control API client's context)."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_context.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(listener.getsockname()) as raw,
            client_context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except ssl.SSLError:
        return False
    finally:
        thread.join(5)
        listener.close()


def _net(tmp_path: Path, files: tuple[Path, ...], host: str) -> tuple[object, Settings]:
    ca, cert, key = files
    decl = {
        "name": "fl-1",
        "backend": "flower",
        "driver": {
            "kind": "local",
            "superlink_dir": str(tmp_path / "superlink"),
            "ssl_certfile": str(cert),
            "ssl_keyfile": str(key),
        },
        "flower": {"address": f"{host}:9093", "root_certificates": str(ca)},
    }
    (net,) = parse_nets([decl], "NETS")
    settings = Settings(
        FLWR_VENV=str(fake_venv(tmp_path / "venv")), FL_DISPATCHER_DATA_DIR=tmp_path / "data"
    )
    return net, settings


@pytest.mark.parametrize(
    ("names", "host", "intermediate"),
    [
        (("127.0.0.1",), "127.0.0.1", True),  # a certificate from an intermediate CA
        (("*.fl.example",), "superlink.fl.example", False),  # a wildcard certificate
    ],
    ids=["intermediate CA", "wildcard"],
)
def test_a_certificate_the_client_accepts_is_no_problem(
    tmp_path: Path, names: tuple[str, ...], host: str, intermediate: bool
) -> None:
    files = _files(tmp_path / "tls", names, intermediate=intermediate)
    assert _client_accepts(*files, host)
    net, settings = _net(tmp_path, files, host)
    assert flower_endpoint_problem(net, settings) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("names", "host", "other_ca", "problem"),
    [
        (("127.0.0.1",), "127.0.0.1", True, "not signed by the CA"),
        (("127.0.0.1", "localhost"), "superlink.example", False, "is not for superlink.example"),
        (("*.fl.example",), "a.b.fl.example", False, "is not for a.b.fl.example"),
    ],
    ids=["another CA", "another host", "a wildcard one level only"],
)
def test_a_certificate_the_client_refuses_is_a_problem(
    tmp_path: Path, names: tuple[str, ...], host: str, other_ca: bool, problem: str
) -> None:
    ca, cert, key = _files(tmp_path / "tls", names, intermediate=False)
    if other_ca:
        ca = _files(tmp_path / "other", names, intermediate=False)[0]
    assert not _client_accepts(ca, cert, key, host)
    net, settings = _net(tmp_path, (ca, cert, key), host)
    found = flower_endpoint_problem(net, settings)  # type: ignore[arg-type]
    assert found is not None and problem in found

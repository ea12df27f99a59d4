"""kit_check on bad admin kits: each defect is AdminMisconfigured with a clear reason.

Kits are built here with `cryptography` (a CA, a client certificate, its key) in the layout
nvflare provisions; the server-side half of the check (the certificate the server presents)
is exercised against a real server in tests/integration/test_nvflare_admin.py.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from app.adapters.nvflare.kit_check import check_kit_files
from app.errors import AdminMisconfigured

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
_KEYS = [rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(4)]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: rsa.RSAPrivateKey,
    issuer: str,
    issuer_key: rsa.RSAPrivateKey,
    *,
    not_before: datetime = NOW - timedelta(days=1),
    not_after: datetime = NOW + timedelta(days=30),
) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(issuer_key, hashes.SHA256())
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def make_kit(
    folder: Path,
    *,
    ca_key: rsa.RSAPrivateKey = _KEYS[0],
    signer_key: rsa.RSAPrivateKey | None = None,
    client_key: rsa.RSAPrivateKey = _KEYS[1],
    key_file_key: rsa.RSAPrivateKey | None = None,
    **validity: datetime,
) -> Path:
    """An admin kit: rootCA.pem, client.crt (signed by `signer_key`), client.key."""
    startup = folder / "startup"
    startup.mkdir(parents=True)
    root = _cert("proj", ca_key, "proj", ca_key)
    client = _cert("admin@nvidia.com", client_key, "proj", signer_key or ca_key, **validity)
    (startup / "rootCA.pem").write_bytes(_pem(root))
    (startup / "client.crt").write_bytes(_pem(client))
    (startup / "client.key").write_bytes(_key_pem(key_file_key or client_key))
    (startup / "fed_admin.json").write_text(
        json.dumps(
            {
                "format_version": 1,
                "admin": {
                    "project_name": "proj",
                    "server_identity": "localhost",
                    "scheme": "http",
                    "host": "localhost",
                    "port": 18002,
                    "connection_security": "mtls",
                    "client_key": "client.key",
                    "client_cert": "client.crt",
                    "ca_cert": "rootCA.pem",
                },
            }
        )
    )
    return folder


def test_a_good_kit_says_where_and_who(tmp_path: Path) -> None:
    kit = check_kit_files(make_kit(tmp_path / "kit"), now=NOW)

    assert (kit.host, kit.port, kit.endpoint) == ("localhost", 18002, "localhost:18002")
    assert (kit.server_identity, kit.project_name, kit.client_cn) == (
        "localhost",
        "proj",
        "admin@nvidia.com",
    )
    assert (kit.scheme, kit.connection_security) == ("http", "mtls")


def _reason(kit_dir: Path) -> str:
    with pytest.raises(AdminMisconfigured) as info:
        check_kit_files(kit_dir, now=NOW)
    message = str(info.value)
    assert message.startswith(f"admin kit {kit_dir}: ")
    assert "PRIVATE KEY" not in message
    return message


def test_missing_config(tmp_path: Path) -> None:
    (tmp_path / "kit" / "startup").mkdir(parents=True)
    assert "fed_admin.json is missing or unreadable" in _reason(tmp_path / "kit")


def test_config_that_is_not_utf8(tmp_path: Path) -> None:
    """An editor that saved it as UTF-16: a misconfiguration, not a UnicodeDecodeError."""
    kit = make_kit(tmp_path / "a")
    config = kit / "startup" / "fed_admin.json"
    config.write_text(config.read_text(), encoding="utf-16")
    assert "startup/fed_admin.json is not UTF-8 text" in _reason(kit)


@pytest.mark.parametrize("port", [-5, 70000])  # 0: "has no 'port'"
def test_config_naming_a_port_no_server_can_listen_on(tmp_path: Path, port: int) -> None:
    kit = make_kit(tmp_path / "a")
    config = kit / "startup" / "fed_admin.json"
    config.write_text(config.read_text().replace("18002", str(port)))
    assert f"port {port} is no port a server can listen on" in _reason(kit)


def test_config_that_is_not_json_or_has_no_admin_section(tmp_path: Path) -> None:
    kit = make_kit(tmp_path / "a")
    (kit / "startup" / "fed_admin.json").write_text("{nope")
    assert "not valid JSON" in _reason(kit)
    (kit / "startup" / "fed_admin.json").write_text("{}")
    assert "no 'admin' section" in _reason(kit)


@pytest.mark.parametrize(
    ("name", "role"),
    [("client.key", "client key"), ("client.crt", "client certificate"), ("rootCA.pem", "root CA")],
)
def test_missing_file(tmp_path: Path, name: str, role: str) -> None:
    kit = make_kit(tmp_path / "kit")
    (kit / "startup" / name).unlink()
    message = _reason(kit)
    assert role in message and "missing or unreadable" in message


def test_client_certificate_of_another_ca(tmp_path: Path) -> None:
    kit = make_kit(tmp_path / "kit", signer_key=_KEYS[2])
    assert "not signed by the kit's root CA" in _reason(kit)


def test_expired_and_not_yet_valid_client_certificate(tmp_path: Path) -> None:
    expired = make_kit(tmp_path / "old", not_after=NOW - timedelta(seconds=1))
    assert "client certificate expired" in _reason(expired)
    future = make_kit(tmp_path / "new", not_before=NOW + timedelta(days=1))
    assert "client certificate is not valid before" in _reason(future)


def test_key_of_another_certificate(tmp_path: Path) -> None:
    kit = make_kit(tmp_path / "kit", key_file_key=_KEYS[3])
    assert "client key does not belong to the client certificate" in _reason(kit)


def test_key_that_is_not_a_key(tmp_path: Path) -> None:
    kit = make_kit(tmp_path / "kit")
    (kit / "startup" / "client.key").write_text("not a key")
    assert "client key is not an unencrypted PEM private key" in _reason(kit)


def test_certificate_that_is_not_a_certificate(tmp_path: Path) -> None:
    kit = make_kit(tmp_path / "kit")
    (kit / "startup" / "client.crt").write_text("garbage")
    assert "client certificate is not a PEM certificate" in _reason(kit)

"""Checks of a Flower net's files before anything dials its SuperLink (`config check` and a
worker's start), as `app.adapters.nvflare.kit_check` checks an NVFLARE admin kit: the CA the
client trusts, and for a local SuperLink the flwr it runs and the certificate it presents.

A certificate the CA did not sign, or that does not name the host the dispatcher dials, is
what a SuperLink of another deployment looks like: every TLS handshake would fail, read as
"SuperLink down" until the readiness deadline. Messages name a file's role and path, never
a key's content.
"""

from __future__ import annotations

import ipaddress
import ssl
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from app.adapters.drivers.local_superlink import PROGRAM
from app.errors import AdminMisconfigured
from app.net_config import FlowerLocalDriverConfig, NetConfig
from app.settings import Settings


def _certificate(net: NetConfig, path: Path, role: str, now: datetime) -> x509.Certificate:
    try:
        certs = x509.load_pem_x509_certificates(path.read_bytes())
    except OSError as exc:
        raise AdminMisconfigured(f"net {net.name}: {role} {path}: {exc.strerror}") from None
    except ValueError:
        raise AdminMisconfigured(f"net {net.name}: {role} {path} is no PEM certificate") from None
    cert = certs[0]
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise AdminMisconfigured(
            f"net {net.name}: {role} {path} is not valid now (valid "
            f"{cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d})"
        )
    return cert


def _names(cert: x509.Certificate) -> set[str]:
    """The host names and addresses a server certificate is for (its SANs)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    names = {name.lower() for name in san.get_values_for_type(x509.DNSName)}
    return names | {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def _host_key(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def check_flower_files(net: NetConfig, settings: Settings, *, now: datetime | None = None) -> None:
    """AdminMisconfigured with the reason if a Flower net's files are missing, unreadable or
    unusable; a net of another backend has none to check."""
    flower = net.flower
    if net.backend != "flower" or flower is None:
        return
    now = now or datetime.now(UTC)
    if flower.root_certificates is not None:
        _certificate(net, flower.root_certificates, "CA certificate", now)
    driver = net.driver
    if not isinstance(driver, FlowerLocalDriverConfig):
        return
    venv = settings.flwr_venv
    if venv is None or not (venv / "bin" / PROGRAM).is_file():
        raise AdminMisconfigured(
            f"net {net.name}: FLWR_VENV={venv} holds no bin/{PROGRAM}: the local driver "
            "cannot start its SuperLink"
        )
    cert = _certificate(net, driver.ssl_certfile, "SuperLink certificate", now)
    try:
        key = serialization.load_pem_private_key(driver.ssl_keyfile.read_bytes(), password=None)
    except OSError as exc:
        raise AdminMisconfigured(
            f"net {net.name}: SuperLink key {driver.ssl_keyfile}: {exc.strerror}"
        ) from None
    except (ValueError, TypeError):
        raise AdminMisconfigured(
            f"net {net.name}: SuperLink key {driver.ssl_keyfile} is no unencrypted PEM key"
        ) from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise AdminMisconfigured(
            f"net {net.name}: SuperLink key {driver.ssl_keyfile} does not belong to its "
            f"certificate {driver.ssl_certfile}"
        )


def flower_endpoint_problem(
    net: NetConfig, settings: Settings, *, now: datetime | None = None
) -> str | None:
    """Why a local SuperLink's certificate cannot be the server the net dials: the net's
    client would refuse it (not signed, through the chain in its file, by the CA the client
    trusts; or not for the host of `flower.address`). None when the client accepts it, or
    when its files cannot be read (`check_flower_files` says so). The client is asked
    itself: a TLS handshake in memory with the net's files, so an intermediate CA or a
    wildcard name it accepts is no problem here either."""
    flower, driver = net.flower, net.driver
    if flower is None or flower.root_certificates is None:
        return None
    if not isinstance(driver, FlowerLocalDriverConfig):
        return None
    now = now or datetime.now(UTC)
    try:
        _certificate(net, flower.root_certificates, "CA certificate", now)
        cert = _certificate(net, driver.ssl_certfile, "SuperLink certificate", now)
    except AdminMisconfigured:
        return None
    host = flower.address.rpartition(":")[0].strip("[]")
    refusal = _tls_refusal(flower.root_certificates, driver.ssl_certfile, driver.ssl_keyfile, host)
    if refusal is None:
        return None
    if refusal.verify_code in _NAME_MISMATCH:
        return (
            f"SuperLink certificate {driver.ssl_certfile} is not for {_host_key(host)} (it "
            f"names {', '.join(sorted(_names(cert))) or 'no host'}), the host of flower.address"
        )
    return (
        f"SuperLink certificate {driver.ssl_certfile} is not signed by the CA "
        f"{flower.root_certificates} the dispatcher trusts ({refusal.verify_message}): files "
        "of another deployment?"
    )


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH = frozenset({62, 64})
_HANDSHAKE_STEPS = 8  # TLS 1.3 takes three (hello, the server's flight, the client's end)


def _tls_refusal(
    ca: Path, certfile: Path, keyfile: Path, host: str
) -> ssl.SSLCertVerificationError | None:
    """The Control API client's verdict on a SuperLink serving these files: what its TLS
    context (`ssl.create_default_context` with the CA file, `server_hostname` the address's
    host) raises in a handshake held in memory, or None when it accepts. None as well when
    the server side cannot load its files (`check_flower_files` says why)."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        server_context.load_cert_chain(certfile, keyfile)
        client_context = ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError):
        return None
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context.wrap_bio(to_client, to_server, server_hostname=host)
    server = server_context.wrap_bio(to_server, to_client, server_side=True)
    for _ in range(_HANDSHAKE_STEPS):
        try:
            client.do_handshake()
            return None
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLCertVerificationError as exc:
            return exc
        try:
            server.do_handshake()
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError:
            return None  # the server's own failure: not a verdict of the client's
    return None

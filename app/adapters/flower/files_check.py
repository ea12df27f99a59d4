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
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
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
    """Why a local SuperLink's certificate cannot be the server the net dials: not signed
    by the CA the client trusts, or not for the host of `flower.address`. None when it can,
    or when its files cannot be read (`check_flower_files` says so)."""
    flower, driver = net.flower, net.driver
    if flower is None or flower.root_certificates is None:
        return None
    if not isinstance(driver, FlowerLocalDriverConfig):
        return None
    now = now or datetime.now(UTC)
    try:
        ca = _certificate(net, flower.root_certificates, "CA certificate", now)
        cert = _certificate(net, driver.ssl_certfile, "SuperLink certificate", now)
    except AdminMisconfigured:
        return None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return (
            f"SuperLink certificate {driver.ssl_certfile} is not signed by the CA "
            f"{flower.root_certificates} the dispatcher trusts: files of another deployment?"
        )
    host = _host_key(flower.address.rpartition(":")[0])
    if host not in _names(cert):
        return (
            f"SuperLink certificate {driver.ssl_certfile} is not for {host} (it names "
            f"{', '.join(sorted(_names(cert))) or 'no host'}), the host of flower.address"
        )
    return None

"""Preflight checks of an NVFLARE admin startup kit, before any login is attempted.

nvflare 2.9 reports a kit signed by another CA, or a kit whose server identity does not match
the server, as a plain `NoConnection` after the full login timeout: exactly what "server down"
looks like. These checks turn those cases into an immediate, explicit `AdminMisconfigured`:

- the kit's files are present and readable, its certificates parse, are within their validity
  period, the client certificate chains to the kit's rootCA and matches the kit's private key;
- the certificate the server presents on its TLS port verifies against the kit's rootCA and
  carries the identity the kit expects (fetched with `ssl` on the kit's host and port).

Messages name the kit folder and the role of a file, never a key's content or a key path
outside the kit.
"""

from __future__ import annotations

import json
import socket
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from app.errors import AdminMisconfigured
from app.net_config import LocalDriverConfig, NetConfig

ADMIN_CONFIG = "fed_admin.json"
MAX_PORT = 65535


@dataclass(frozen=True)
class AdminKit:
    """What a checked admin kit says about where and who to connect to."""

    kit_dir: Path
    project_name: str
    host: str
    port: int
    server_identity: str
    connection_security: str
    scheme: str
    ca_cert: Path
    client_cert: Path
    client_key: Path
    client_cn: str

    @property
    def endpoint(self) -> str:
        """host:port as the kit dials it."""
        return f"{self.host}:{self.port}"


class ServerProbe(StrEnum):
    """What the server's port said to a TLS handshake made with the kit's rootCA."""

    REFUSED = "refused"  # nothing listens (down, scaled to zero, or still booting)
    NOT_SERVING = "not_serving"  # something listens but completes no TLS handshake or request
    VERIFIED = "verified"  # the server's certificate is from the kit's CA, with its identity


def _misconfigured(kit_dir: Path, problem: str) -> AdminMisconfigured:
    return AdminMisconfigured(f"admin kit {kit_dir}: {problem}")


def _read_pem_certs(kit_dir: Path, path: Path, role: str) -> list[x509.Certificate]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _misconfigured(kit_dir, f"{role} is missing or unreadable ({exc.strerror})") from None
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise _misconfigured(kit_dir, f"{role} is not a PEM certificate") from None
    if not certs:
        raise _misconfigured(kit_dir, f"{role} holds no certificate")
    return certs


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else ""
    return value if isinstance(value, str) else value.decode()


def _check_validity(kit_dir: Path, cert: x509.Certificate, role: str, now: datetime) -> None:
    if now < cert.not_valid_before_utc:
        raise _misconfigured(
            kit_dir, f"{role} is not valid before {cert.not_valid_before_utc.isoformat()}"
        )
    if now > cert.not_valid_after_utc:
        raise _misconfigured(kit_dir, f"{role} expired on {cert.not_valid_after_utc.isoformat()}")


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _chains_to(chain: list[x509.Certificate], root: x509.Certificate) -> bool:
    current = chain[0]
    for intermediate in chain[1:]:
        if not _issued_by(current, intermediate):
            return False
        current = intermediate
    return current == root or _issued_by(current, root)


def _load_config(kit_dir: Path) -> dict[str, Any]:
    config_path = kit_dir / "startup" / ADMIN_CONFIG
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _misconfigured(
            kit_dir, f"startup/{ADMIN_CONFIG} is missing or unreadable ({exc.strerror})"
        ) from None
    except UnicodeDecodeError:  # saved as UTF-16 by an editor, say
        raise _misconfigured(kit_dir, f"startup/{ADMIN_CONFIG} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise _misconfigured(kit_dir, f"startup/{ADMIN_CONFIG} is not valid JSON: {exc}") from None
    except RecursionError:  # valid JSON nested past the interpreter's recursion limit
        raise _misconfigured(kit_dir, f"startup/{ADMIN_CONFIG} is nested too deeply") from None
    admin = raw.get("admin") if isinstance(raw, dict) else None
    if not isinstance(admin, dict):
        raise _misconfigured(kit_dir, f"startup/{ADMIN_CONFIG} has no 'admin' section")
    return admin


def _kit_file(kit_dir: Path, admin: dict[str, Any], key: str, role: str) -> Path:
    name = admin.get(key)
    if not isinstance(name, str) or not name:
        raise _misconfigured(kit_dir, f"startup/{ADMIN_CONFIG} does not name the {role}")
    # nvflare resolves these names inside the kit's startup folder.
    return kit_dir / "startup" / name


def check_kit_files(kit_dir: Path, *, now: datetime | None = None) -> AdminKit:
    """Check the kit on disk; AdminMisconfigured with the reason if anything is wrong."""
    now = now or datetime.now(UTC)
    admin = _load_config(kit_dir)
    for key in ("host", "port", "project_name"):
        if not admin.get(key):
            raise _misconfigured(kit_dir, f"startup/{ADMIN_CONFIG} has no '{key}'")
    try:
        port = int(admin["port"])
    except (TypeError, ValueError):
        raise _misconfigured(kit_dir, f"startup/{ADMIN_CONFIG} port is not a number") from None
    if not 1 <= port <= MAX_PORT:
        raise _misconfigured(
            kit_dir, f"startup/{ADMIN_CONFIG} port {port} is no port a server can listen on"
        )

    ca_path = _kit_file(kit_dir, admin, "ca_cert", "root CA certificate")
    cert_path = _kit_file(kit_dir, admin, "client_cert", "client certificate")
    key_path = _kit_file(kit_dir, admin, "client_key", "client key")

    root = _read_pem_certs(kit_dir, ca_path, "root CA certificate")[0]
    chain = _read_pem_certs(kit_dir, cert_path, "client certificate")
    _check_validity(kit_dir, root, "root CA certificate", now)
    _check_validity(kit_dir, chain[0], "client certificate", now)
    if not _chains_to(chain, root):
        raise _misconfigured(
            kit_dir,
            f"client certificate (CN={_common_name(chain[0])!r}) is not signed by the kit's "
            f"root CA (CN={_common_name(root)!r}): files from different projects?",
        )
    try:
        private_key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        raise _misconfigured(
            kit_dir, f"client key is missing or unreadable ({exc.strerror})"
        ) from None
    except (ValueError, TypeError):
        raise _misconfigured(kit_dir, "client key is not an unencrypted PEM private key") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private_key.public_key().public_bytes(*spki) != chain[0].public_key().public_bytes(*spki):
        raise _misconfigured(kit_dir, "client key does not belong to the client certificate")

    return AdminKit(
        kit_dir=kit_dir,
        project_name=str(admin["project_name"]),
        host=str(admin["host"]),
        port=port,
        server_identity=str(admin.get("server_identity") or "server"),
        connection_security=str(admin.get("connection_security") or "mtls").lower(),
        scheme=str(admin.get("scheme") or "grpc").lower(),
        ca_cert=ca_path,
        client_cert=cert_path,
        client_key=key_path,
        client_cn=_common_name(chain[0]),
    )


def probe_server(kit: AdminKit, *, timeout: float = 2.0) -> ServerProbe:
    """Handshake with the server's port as the kit would, and check who answers.

    REFUSED and NOT_SERVING are for the caller to judge (down / still starting / something
    else on the port); a server certificate from another CA or with another identity raises
    AdminMisconfigured at once. On the `http` scheme the probe also sends one plain HTTP
    request and waits for any answer: nvflare 2.9's websocket connect (aiohttp) has a 300 s
    default timeout that its session close then waits out, so a port that completes TLS but
    never answers must be recognised here, before a login is attempted.
    """
    try:
        sock = socket.create_connection((kit.host, kit.port), timeout=timeout)
    except OSError:
        return ServerProbe.REFUSED
    with sock:
        if kit.connection_security == "clear":
            return ServerProbe.VERIFIED  # nothing to verify on a cleartext port
        context = ssl.create_default_context(cafile=str(kit.ca_cert))
        context.check_hostname = False  # nvflare checks the CN against server_identity instead
        if kit.connection_security == "mtls":
            context.load_cert_chain(str(kit.client_cert), str(kit.client_key))
        try:
            with context.wrap_socket(sock, server_hostname=kit.host) as tls:
                der = tls.getpeercert(binary_form=True)
                _check_identity(kit, der)
                if kit.scheme == "http" and not _answers_http(tls, kit):
                    return ServerProbe.NOT_SERVING
        except ssl.SSLCertVerificationError as exc:
            raise _misconfigured(
                kit.kit_dir,
                f"the server at {kit.endpoint} presents a certificate this kit's root CA does "
                f"not accept ({exc.verify_message}): the kit belongs to another project or CA, "
                "or the net points at another server",
            ) from None
        except (OSError, ssl.SSLError):
            return ServerProbe.NOT_SERVING
    return ServerProbe.VERIFIED


def _check_identity(kit: AdminKit, der: bytes | None) -> None:
    if der is None:
        raise ssl.SSLError("no peer certificate")
    server_cn = _common_name(x509.load_der_x509_certificate(der))
    if server_cn != kit.server_identity:
        raise _misconfigured(
            kit.kit_dir,
            f"the kit expects server identity {kit.server_identity!r} but the server at "
            f"{kit.endpoint} is {server_cn!r}",
        )


def _answers_http(tls: ssl.SSLSocket, kit: AdminKit) -> bool:
    request = f"GET /f3 HTTP/1.1\r\nHost: {kit.endpoint}\r\nConnection: close\r\n\r\n"
    tls.sendall(request.encode())
    return tls.recv(16).startswith(b"HTTP/")


def preflight(kit_dir: Path, *, timeout: float = 2.0) -> tuple[AdminKit, ServerProbe]:
    """Both checks: the kit on disk, then what its server presents."""
    kit = check_kit_files(kit_dir)
    return kit, probe_server(kit, timeout=timeout)


def server_endpoint_of(net: NetConfig) -> str | None:
    """host:port the net's server serves on, where it is known: declared in the net's config,
    or read from the local driver's server kit. None for a net that declares none."""
    if net.server_endpoint:
        return net.server_endpoint
    if isinstance(net.driver, LocalDriverConfig):
        from app.adapters.nvflare.participants import server_endpoint

        try:
            host, port = server_endpoint(net.driver.server_kit_dir)
        except (OSError, ValueError, KeyError, IndexError):
            return None
        return f"{host}:{port}"
    return None


def kit_endpoint_problem(net: NetConfig, *, unread_is_a_problem: bool = True) -> str | None:
    """Why the net's admin kit cannot be for the net's server, or None. A kit provisioned for
    another project names another server: that is a misconfiguration, never a server that
    "does not come up" (which is how it would look at readiness). A kit config this process
    cannot read is one too, unless `unread_is_a_problem` is False (config check, which
    warns about it as this user's)."""
    expected = server_endpoint_of(net)
    if expected is None or net.admin is None:  # no endpoint, or no NVFLARE net
        return None
    try:
        admin = _load_config(net.admin.kit_dir)
        dialled = f"{admin.get('host')}:{admin.get('port')}"
    except AdminMisconfigured as exc:
        return str(exc) if unread_is_a_problem else None
    if dialled.lower() != expected.lower():
        return (
            f"admin kit {net.admin.kit_dir} dials {dialled}, but net {net.name}'s server "
            f"serves on {expected}: a kit provisioned for another project or server?"
        )
    return None

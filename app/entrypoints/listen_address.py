"""`fl-dispatcher api --host-of NAME`: listen on this machine's own address that NAME names.

A container on several networks has one address on each; `--host 0.0.0.0` listens on all of
them. compose's api joins `federated-learning` only to call the fl-servers' admin ports, and
must not answer there, where submitted job code runs (app/entrypoints/README.md "Who reaches
what"). A network alias given on the default network only names the api's address on that
network (Docker's and podman's embedded DNS answer an alias per network), so
`--host-of api-listener` binds that one address.

NAME is resolved once, at start. Of its addresses the first one this machine owns is taken
(with replicas an alias names every replica's address); none, or no answer at all, is an
error: never a silent fallback to listening everywhere.
"""

from __future__ import annotations

import ipaddress
import socket

from app.errors import MisconfigurationError


class ListenAddressError(MisconfigurationError):
    """--host-of NAME names no address of this machine."""


def own_address_of(name: str) -> str:
    """The first address NAME resolves to that this machine can bind."""
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ListenAddressError(f"--host-of {name}: the name does not resolve ({reason})") from exc
    addresses: list[str] = []
    for family, _, _, _, sockaddr in found:
        address = str(sockaddr[0])
        if address in addresses:
            continue
        addresses.append(address)
        if ipaddress.ip_address(address.partition("%")[0]).is_unspecified:
            continue  # 0.0.0.0 or :: is every address: the very thing this option avoids
        if _bindable(family, sockaddr):
            return address
    raise ListenAddressError(
        f"--host-of {name}: it resolves to {', '.join(addresses) or 'nothing'}, none of them "
        "an address of this machine"
    )


def _bindable(family: int, sockaddr: tuple[object, ...]) -> bool:
    """Whether a socket can be bound to this address here (any free port)."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((sockaddr[0], 0, *sockaddr[2:]))
        except OSError:
            return False
    return True

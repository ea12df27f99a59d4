"""Masking a URL's credentials wherever one may be shown: the configuration (`config
check`), the `db` commands' lines, log lines and the errors kept in rows."""

from __future__ import annotations

import re
from urllib.parse import unquote_plus


def redact_url(url: str) -> str:
    """Mask the password in a URL such as postgresql://user:secret@host/db: all of it up to
    the URL's last `@` (kombu reads a password holding an `@` up to the last one, SQLAlchemy
    one holding a `/`); an `@` further on (a query's) masks more, never less. A query's
    secret parameters too (`?password=`, libpq's and redis-py's keyword, or a receiver's
    `?api_key=`, `?code=`, `?sig=`: `secret_parameter`), each to the next `&` (SQLAlchemy
    reads a `#` in it as its own)."""
    return _mask_query(redact_authority(url), stop="&")


def redact_text(text: str) -> str:
    """`redact_url` for a log line or an error's text, where a URL ends at a space or a
    quote: a query's password-like value is masked to the next `&`, space or quote, and the
    rest of the line (an access line's status, a statement's parameters) is left alone."""
    return _mask_query(redact_authority(text), stop="&\\s\"'")


def redact_authority(text: str) -> str:
    """The password of a URL's `user:password@` masked (see `redact_url`)."""
    return re.sub(r"(://[^:/@]*:).*@", r"\1***@", text)


def secret_parameter(name: str) -> bool:
    """Whether a URL query parameter named `name` (as written: percent-encoded or not, any
    case) carries a secret: a password (password, sslpassword, passwd), a token, a secret, a
    key (key, apikey, api_key, access_key, x-functions-key; not caller_key or sslkey), a
    signature (signature, x-amz-signature, SAS's sig), code (an Azure Functions key), auth
    or credential(s)."""
    decoded = unquote_plus(name).lower()
    if decoded in _NOT_SECRET_PARAMETERS:
        return False
    return decoded in _SECRET_PARAMETER_NAMES or decoded.endswith(_SECRET_PARAMETER_ENDINGS)


_SECRET_PARAMETER_ENDINGS = ("password", "passwd", "token", "secret", "key", "signature")
# Only these exact names: `code` and `auth` end many names that are no secret (reason_code).
_SECRET_PARAMETER_NAMES = frozenset({"code", "sig", "auth", "credential", "credentials"})
# Names ending in `key` whose value is no secret and is needed in a line: caller_key is
# flip-api's idempotency key (the status API's `GET /jobs?caller_key=`, logged on purpose),
# libpq's sslkey the path of the client key's file.
_NOT_SECRET_PARAMETERS = frozenset({"caller_key", "sslkey"})


def _mask_query(text: str, *, stop: str) -> str:
    def masked(found: re.Match[str]) -> str:
        name = found.group(2)
        return f"{found.group(1)}{name}=***" if secret_parameter(name) else found.group(0)

    return re.sub(rf"([?&;])([^=&#\s?]+)=[^{stop}]*", masked, text)

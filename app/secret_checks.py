"""Checks of the secrets a process starts with (app.settings calls them): each refuses the
start with a SettingsError naming the setting, and never quotes the secret."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from app.errors import SettingsError

# The example env file's placeholders (app/deploy/examples/compose.env) begin so; its
# values are public, so one left in place is no secret at all, however long.
_PLACEHOLDER = re.compile(r"change-?me", re.IGNORECASE)


def refuse_placeholders(**secrets: str) -> None:
    """SettingsError naming the first setting whose secret is still the example's
    placeholder (`change-me...`): copied and forgotten, it would serve as the key of every
    mutating route, the callbacks' signature or the database's password. Never quoted."""
    for name, value in secrets.items():
        if value and _PLACEHOLDER.match(value):
            raise SettingsError(
                f"{name} is the example's placeholder (change-me...): set a secret of your own "
                "(e.g. `openssl rand -hex 32`)"
            )


def url_password(url: str) -> str:
    """The password of a URL (empty without one, or where urlsplit cannot read it)."""
    try:
        return urlsplit(url).password or ""
    except ValueError:  # a URL urlsplit cannot read: its own check reports it
        return ""


def check_api_secret(secret: str) -> None:
    """API_SECRET travels in the X-API-Key header, which carries printable ASCII only: the
    server reads other bytes as Latin-1, so a secret with any other character (or with
    the spaces a header loses at its ends) could never match. Refused at start rather than
    answering every request 401. The message never quotes the secret."""
    if secret and not (secret.isascii() and secret.isprintable() and secret == secret.strip()):
        raise SettingsError(
            "API_SECRET must be printable ASCII without spaces at its ends: the X-API-Key "
            "header cannot carry anything else (e.g. `openssl rand -hex 32`)"
        )
    if secret and len(secret) < 16:
        # The key of every mutating route (enqueue, abort, drain every net), which job code
        # on compose's network can reach: a short one (a placeholder left in an env file)
        # is guessed in a few requests. Unset disables those routes instead.
        raise SettingsError(
            "API_SECRET must be at least 16 characters when set (e.g. `openssl rand -hex 32`)"
        )

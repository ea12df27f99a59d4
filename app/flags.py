"""Boolean flags, parsed the one way every setting and every process reads them.

A module of one function on purpose: `app.settings` (process-wide flags) and
`app.net_config` (a net's own) both parse flags the same way; the parser belongs to neither's
job, so it sits below both rather than in net_config, where settings would import a
deployment's net schema for a string parser."""

from __future__ import annotations

from app.errors import SettingsError

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def parse_flag(name: str, raw: object, default: bool) -> bool:
    """Parse a boolean flag the one way every process does: true/false/1/0/yes/no/on/off,
    any case, surrounding spaces ignored; empty means `default`; anything else is an error."""
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text == "":
        # A Makefile `export` of a commented-out line yields exactly this.
        return default
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SettingsError(
        f"{name}={raw!r} is not a boolean; accepted (any case): "
        "true/false, 1/0, yes/no, on/off, or empty for the default "
        f"({str(default).lower()})"
    )

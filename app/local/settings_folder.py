"""A folder's own settings: `nets.toml` (its `[[nets]]`) and `fl-dispatcher.env` (NAME=value
lines, read with `fl-dispatcher --env-file`), as `demo --keep` and `local-net` leave them, so
that `status`, `jobs`, the status API and its nets page show what ran there."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NETS_FILE = "nets.toml"
ENV_FILE = "fl-dispatcher.env"

# Never written to a settings file: secrets, and the callback settings of a run whose
# receiver (the demo's stand-in for flip-api) ended with it.
_LEFT_OUT = (
    "CALLBACK_URL",
    "CALLBACK_SECRET",
    "CALLBACK_PREVIOUS_SECRET",
    "API_SECRET",
    "FLOWER_BASIC_AUTH",
)


def shell_word(path: Path | str) -> str:
    """`path` as one shell word, quoted only where it needs it; a leading `~/` is left bare
    so that the shell still expands it (`~/'FL nets'/local`)."""
    text = str(path)
    if text.startswith("~/"):
        return "~/" + (shlex.quote(text[2:]) if text[2:] else "")
    return shlex.quote(text)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def nets_toml(nets: list[Mapping[str, Any]]) -> str:
    """Net declarations (as NETS takes them) as a nets file: one `[[nets]]` each, its
    `driver` and `admin` as sub-tables."""
    lines: list[str] = []
    for net in nets:
        lines.append("[[nets]]")
        tables = {k: v for k, v in net.items() if isinstance(v, Mapping)}
        lines += [f"{k} = {_toml_value(v)}" for k, v in net.items() if k not in tables]
        for name, table in tables.items():
            lines.append(f"[nets.{name}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
        lines.append("")
    return "\n".join(lines)


def _without_password(url: str) -> str | None:
    """`url` with its password left out (the user kept), or None when it holds none: in
    its user part (`scheme://user:password@host`, read up to the last '@' as a client
    reads it) or as a `password=` query parameter."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    netloc, slash, path = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    changed = bool(at) and ":" in userinfo
    if changed:
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}@{host}" if user else host
    path, mark, query = path.partition("?")
    if mark:
        kept = [p for p in query.split("&") if p.split("=", 1)[0].lower() != "password"]
        changed = changed or len(kept) < len(query.split("&"))
        query = "&".join(kept)
    return f"{scheme}://{netloc}{slash}{path}{'?' if query else ''}{query}" if changed else None


def _env_value(name: str, text: str) -> str:
    """`text` as the settings loader (python-dotenv), compose and a shell's `set -a; . FILE`
    all read it back: bare when plain, else single-quoted (literal to all three), else,
    for a quote or backslashes, double-quoted with `\\` and `\"` escaped (read alike by
    all three while it holds no `$` or backtick)."""
    if "\n" in text or "\r" in text or "${" in text:
        # python-dotenv expands ${...} in every form, quoted or not.
        raise ValueError(f"{name}: a value with a newline or '${{' has no env-file form")
    if text and all(c.isalnum() or c in "/._-:+@,=" for c in text):
        return text
    if "'" not in text and "\\\\" not in text and not text.endswith("\\"):
        # python-dotenv reads `\\` in single quotes as one backslash, a shell as two.
        return f"'{text}'"
    if "$" in text or "`" in text:
        raise ValueError(
            f"{name}: a value with a quote or a backslash and a '$' or '`' has no env-file "
            "form that a shell and the settings loader read alike"
        )
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def env_lines(values: Mapping[str, object], header: str) -> str:
    """Settings as `NAME=value` lines under a `#` header (secrets, callbacks and URL
    passwords left out), each value in a form `--env-file`, compose and a shell read alike.
    ValueError naming the setting for a value no such form holds."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for name, value in values.items():
        if name in _LEFT_OUT:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        bare = _without_password(text)
        if bare is not None:
            # The file is for reading a folder's settings again, and world-readable.
            lines.append(
                f"# {name} without its password: export {name} with it (the environment "
                "wins over this file)"
            )
            text = bare
        lines.append(f"{name}={_env_value(name, text)}")
    return "\n".join(lines) + "\n"


def settings_folder_texts(
    folder: Path, settings: Mapping[str, object], nets: list[Mapping[str, Any]], header: str
) -> dict[str, str]:
    """What `write_settings_folder` writes, by file name, naming `folder`'s paths (built
    before anything is written, so a value no file can hold stops nothing half made)."""
    values = {k: v for k, v in settings.items() if k not in ("NETS", "NETS_FILE")}
    return {
        NETS_FILE: nets_toml(nets),
        ENV_FILE: env_lines({**values, "NETS_FILE": folder / NETS_FILE}, header),
    }


def write_settings_folder(
    folder: Path, settings: Mapping[str, object], nets: list[Mapping[str, Any]], header: str
) -> Path:
    """Write `folder/nets.toml` and `folder/fl-dispatcher.env` (which names it as
    NETS_FILE); returns the env file."""
    for name, text in settings_folder_texts(folder, settings, nets, header).items():
        (folder / name).write_text(text)
    return folder / ENV_FILE

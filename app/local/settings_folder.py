"""A folder's own settings: `nets.toml` (its `[[nets]]`) and `fl-dispatcher.env` (NAME=value
lines, read with `fl-dispatcher --env-file`), as `demo --keep` and `local-net` leave them, so
that `status`, `jobs`, the status API and its nets page show what ran there."""

from __future__ import annotations

import json
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


def env_lines(values: Mapping[str, object], header: str) -> str:
    """Settings as `NAME=value` lines under a `#` header (secrets and callbacks left out).
    Values are single-quoted unless plain, so the file reads the same to `--env-file`,
    compose and a shell's `set -a; . FILE`."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for name, value in values.items():
        if name in _LEFT_OUT:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        if "'" in text or "\n" in text:
            raise ValueError(f"{name}: a value with a quote or a newline has no env-file form")
        plain = text and all(c.isalnum() or c in "/._-:+@,=" for c in text)
        lines.append(f"{name}={text}" if plain else f"{name}='{text}'")
    return "\n".join(lines) + "\n"


def write_settings_folder(
    folder: Path, settings: Mapping[str, object], nets: list[Mapping[str, Any]], header: str
) -> Path:
    """Write `folder/nets.toml` and `folder/fl-dispatcher.env` (which names it as
    NETS_FILE); returns the env file."""
    nets_file = folder / NETS_FILE
    nets_file.write_text(nets_toml(nets))
    env_file = folder / ENV_FILE
    values = {k: v for k, v in settings.items() if k not in ("NETS", "NETS_FILE")}
    env_file.write_text(env_lines({**values, "NETS_FILE": nets_file}, header))
    return env_file

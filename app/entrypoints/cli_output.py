"""How `fl-dispatcher` prints: exit codes, aligned tables, short times, and JSON documents
on a stdout that carries nothing else."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from pydantic import ValidationError

    from app.read_models import DrainView

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_SETTINGS = 2

# With --json, stdout carries the JSON document and nothing else: main() sends whatever else
# is printed there to stderr (NVFLARE 2.9's admin client prints "Connecting to FLARE ..."
# to stdout while a net is probed) and keeps the real stdout here for the document.
JSON_STDOUT: dict[str, TextIO] = {}


def invalid_request(command: str, exc: ValidationError, err: TextIO) -> int:
    """A request the command's arguments made that its schema refuses: one line per field
    on `err`, EXIT_FAILED (never a traceback)."""
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"])
        err.write(f"fl-dispatcher: {command}: {field}: {error['msg']}\n")
    return EXIT_FAILED


def print_json(data: Any, out: TextIO) -> None:
    """`data` as an indented JSON document (on the real stdout while --json holds it)."""
    out = JSON_STDOUT.get("out", out)
    out.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    out.flush()


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO) -> None:
    """Rows under their headers in aligned columns; None shows as "-"."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def short_time(iso: str | None) -> str:
    """An ISO time to the second, as a terminal shows it ("-" for none)."""
    return iso[:19].replace("T", " ") if iso else "-"


def describe_drain(view: DrainView) -> list[str]:
    """The drain in a few lines, as `drain`, `undrain` and `status` print it."""
    if view.state == "none":
        return ["drain: none (every net takes new jobs)"]
    scope = (
        f"the whole deployment since {short_time(view.deployment_since)}"
        if view.deployment
        else ", ".join(n.name for n in view.nets)
    )
    lines = [f"drain: {view.state.upper()} ({scope}); queued jobs waiting: {view.queued}"]
    for net in view.nets:
        job = net.active_job
        left = f"job {job.id} {job.state}" if job else "nothing active"
        lines.append(f"  {net.name}: {net.state or 'no row yet'}, {left}")
    if view.complete:
        lines.append("  no drained net has an active job: safe to stop the processes and deploy")
    return lines

"""`fl-dispatcher drain` and `undrain`: take nets, or the whole deployment, out of the
rotation before a redeploy, and put them back (app/entrypoints/README.md "Drain before a
redeploy"); the same use case as POST /drain and POST /undrain."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.entrypoints import cli_args, cli_jobs
from app.entrypoints.cli_output import EXIT_FAILED, EXIT_OK, describe_drain, print_json
from app.read_models import DrainChanged
from app.settings import Settings

if TYPE_CHECKING:
    from app.runtime import Runtime

Handler = Callable[[argparse.Namespace, Settings], int]

# How often `drain --wait` reads the drain again.
WAIT_POLL_S = 5.0


def cmd_drain(args: argparse.Namespace, settings: Settings) -> int:
    """Drain nets (or --all): no new claim or prewarm; what runs finishes."""
    from app.usecases import drains

    runtime = cli_jobs._runtime(settings)  # the one tests replace
    try:
        view = drains.drain(runtime, args.nets, everything=args.all, reason=args.reason)
        if args.wait is not None:
            view = _wait(runtime, view, args.wait)
    finally:
        runtime.close()
    _print(view, args.json)
    if args.wait is not None and not view.complete:
        sys.stderr.write(f"fl-dispatcher: drain: not complete after {args.wait:.0f}s\n")
        return EXIT_FAILED
    return EXIT_OK


def _wait(runtime: Runtime, view: DrainChanged, wait_s: float) -> DrainChanged:
    from app.usecases import drains

    deadline = time.monotonic() + wait_s
    while not view.complete and time.monotonic() < deadline:
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
        now = drains.drain_view(runtime)
        view = DrainChanged(**now.model_dump(), notified=view.notified)
    return view


def cmd_undrain(args: argparse.Namespace, settings: Settings) -> int:
    """Undrain nets (or --all) and kick the assigner."""
    from app.usecases import drains

    runtime = cli_jobs.sending_runtime(settings)
    try:
        view = drains.undrain(runtime, args.nets, everything=args.all)
    finally:
        runtime.close()
    _print(view, args.json)
    if view.notified is False:
        sys.stderr.write("warning: the workers were not told; beat's assign round will run\n")
    return EXIT_OK


def _print(view: DrainChanged, as_json: bool) -> None:
    if as_json:
        print_json(view.model_dump(mode="json"), sys.stdout)
    else:
        sys.stdout.write("\n".join(describe_drain(view)) + "\n")


def add_drain_commands(
    add: Callable[[str, Handler | None, str], argparse.ArgumentParser],
    json_flag: Callable[[argparse.ArgumentParser], None],
) -> None:
    """The two commands' parsers."""
    p = add(
        "drain",
        cmd_drain,
        "take nets (or --all) out of the rotation: no new job or prewarm; what runs finishes",
    )
    p.add_argument("nets", nargs="*", metavar="NET", help="a declared net (or --all)")
    p.add_argument(
        "--all", action="store_true", help="the whole deployment, nets added to NETS later too"
    )
    p.add_argument(
        "--reason",
        default="",
        help="kept with the drain (e.g. the release; at most 500 characters)",
    )
    p.add_argument(
        "--wait",
        type=cli_args.seconds_or_zero,
        metavar="S",
        help="then wait up to S seconds until no drained net has an active job (exit 1 if not)",
    )
    json_flag(p)

    p = add("undrain", cmd_undrain, "put drained nets (or --all) back and kick the assigner")
    p.add_argument("nets", nargs="*", metavar="NET", help="a drained net (or --all)")
    p.add_argument("--all", action="store_true", help="every drain, the deployment's too")
    json_flag(p)

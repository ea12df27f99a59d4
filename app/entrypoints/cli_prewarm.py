"""`fl-dispatcher prewarm` and `cancel-prewarm`: flip-api's hint that a job is likely soon,
from a terminal, through the same use case as the task and the HTTP route."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from app.entrypoints import cli_jobs
from app.entrypoints.cli_jobs import sending_runtime
from app.entrypoints.cli_output import (
    EXIT_FAILED,
    EXIT_OK,
    invalid_request,
    print_json,
    short_time,
)
from app.errors import InvalidRequest
from app.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]


def cmd_prewarm(args: argparse.Namespace, settings: Settings) -> int:
    """Say a job is likely within --within seconds: hold its net's server ready until then."""
    from pydantic import ValidationError

    from app.schemas import PrewarmNet
    from app.usecases import prewarm

    try:
        request = PrewarmNet(
            caller_key=args.key, net=args.net, required_sites=args.site or [], within_s=args.within
        )
    except ValidationError as exc:
        return invalid_request("prewarm", exc, sys.stderr)
    runtime = sending_runtime(settings)
    try:
        requested = prewarm.request_prewarm(runtime, request)
    except InvalidRequest as exc:  # recorded by the use case, as the task's refusals are
        code = prewarm.refusal_code(exc)
        sys.stderr.write(f"fl-dispatcher: prewarm refused: {exc} (reason_code: {code})\n")
        return EXIT_FAILED
    finally:
        runtime.close()
    view = requested.prewarm
    if args.json:
        print_json(requested.answer().model_dump(mode="json"), sys.stdout)
    else:
        verb = "prewarm accepted" if requested.created else "already known"
        sys.stdout.write(
            f"{verb}: net {view.net} {view.status} until {short_time(view.hold_until)}"
            f" ({view.detail or view.status})\n"
        )
    if requested.notified is False:
        sys.stderr.write("warning: the workers were not told; beat will start the server\n")
    return EXIT_OK


def cmd_cancel_prewarm(args: argparse.Namespace, settings: Settings) -> int:
    """End a prewarm's hold now; the net's idle grace starts."""
    from app.usecases import prewarm

    runtime = cli_jobs._runtime(settings)  # the one tests replace
    try:
        view = prewarm.cancel_prewarm(runtime, args.key)
    finally:
        runtime.close()
    if args.json:
        print_json(view.model_dump(mode="json"), sys.stdout)
    else:
        sys.stdout.write(f"prewarm {view.caller_key}: {view.status} (net {view.net})\n")
    return EXIT_OK


def add_prewarm_commands(
    add: Callable[[str, Handler | None, str], argparse.ArgumentParser],
    json_flag: Callable[[argparse.ArgumentParser], None],
) -> None:
    """The two commands' parsers."""
    p = add(
        "prewarm",
        cmd_prewarm,
        "a job is likely within S seconds: bring its net's server up and hold it ready",
    )
    p.add_argument("--key", required=True, help="the caller's idempotency key for this hint")
    p.add_argument(
        "--within",
        type=float,
        required=True,
        metavar="S",
        help="the job is likely within S seconds (held at most PREWARM_MAX_S)",
    )
    p.add_argument("--net", help="the net to warm (default: the one a job for --site would take)")
    p.add_argument("--site", action="append", metavar="S", help="a site the job needs (repeat)")
    json_flag(p)

    p = add("cancel-prewarm", cmd_cancel_prewarm, "end a prewarm's hold now")
    p.add_argument("key", metavar="KEY", help="the caller_key the prewarm was sent with")
    json_flag(p)

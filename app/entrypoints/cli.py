"""`fl-dispatcher`: the operator's command line.

Human tables by default, `--json` for scripts. Every command builds Settings once from the
environment; a settings error prints its message and exits 2. Commands call the same use
cases (`app.usecases.intake`, `app.usecases.views`) as the status API, print the read models
they return (`app.read_models`; `--json` is `model_dump(mode="json")`, the API's JSON), and
print no secrets (configuration is shown through `Settings.redacted()`). Only `api` loads
the HTTP stack (FastAPI, uvicorn); heavy imports stay inside the command that needs them.

Exit codes: 0 ok, 1 the command failed (not found, bad input, unreachable), 2 settings.

This module parses the command line and runs the command: the commands live in `cli_jobs`
(configuration, nets, jobs), `cli_services` (processes, database) and `cli_offline` (output
from the code alone), and print through `cli_output`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy.exc import DBAPIError

from app.entrypoints import cli_args
from app.entrypoints.cli_drain import add_drain_commands
from app.entrypoints.cli_jobs import (
    cmd_abort,
    cmd_config_check,
    cmd_enqueue,
    cmd_job,
    cmd_jobs,
    cmd_status,
)
from app.entrypoints.cli_offline import cmd_diagram, cmd_schema, cmd_simulate
from app.entrypoints.cli_output import EXIT_FAILED, EXIT_SETTINGS, JSON_STDOUT
from app.entrypoints.cli_prewarm import add_prewarm_commands
from app.entrypoints.cli_services import (
    cmd_api,
    cmd_beat,
    cmd_db,
    cmd_demo,
    cmd_local_net,
    cmd_participant,
    cmd_ready,
    cmd_worker,
)
from app.errors import DispatcherError, RequestRejected, SettingsError
from app.process_guard import refuse_same_user_inspection
from app.redact import redact_url
from app.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fl-dispatcher")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also used by tests to check compose.yml's commands)."""
    parser = argparse.ArgumentParser(
        prog="fl-dispatcher",
        description="Queue federated-learning jobs and scale each net's NVFLARE server.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--env-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="also read settings from this file of NAME=value lines (the environment wins), "
        "as FL_DISPATCHER_ENV_FILE names it to every process: the fl-dispatcher.env of a "
        "folder `demo --keep` or `local-net` made",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler | None, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        return p

    def json_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="machine-readable output")

    config = add("config", None, "configuration commands")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    check = config_sub.add_parser("check", help="validate settings and print them, redacted")
    check.set_defaults(handler=cmd_config_check)
    json_flag(check)

    p = add("status", cmd_status, "every net, its server and active job, and the queue")
    json_flag(p)
    p.add_argument(
        "--no-probe", action="store_true", help="SQL state only; do not contact drivers/servers"
    )
    p.add_argument(
        "--probe-timeout",
        type=cli_args.seconds,
        default=3.0,
        metavar="S",
        help="per-net probe deadline (default 3)",
    )

    _add_job_commands(add, json_flag)
    add_prewarm_commands(add, json_flag)
    add_drain_commands(add, json_flag)

    db = add("db", cmd_db, "database schema (Alembic)")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    upgrade = db_sub.add_parser("upgrade", help="migrate up")
    upgrade.add_argument("revision", nargs="?", default="head", help="default: head")
    _wait_flag(upgrade, "the database")
    db_sub.add_parser("downgrade", help="migrate down").add_argument(
        # One step by default: `base` drops every table and would be a costly typo.
        "revision",
        nargs="?",
        default="-1",
        help="default: -1 (one revision); 'base' drops everything",
    )
    db_sub.add_parser("check", help="fail if models and migrations have drifted")

    add("diagram", None, "print the job and net state diagrams (Mermaid)").set_defaults(
        handler=None, plain=cmd_diagram
    )

    add(
        "schema",
        None,
        "print the public contract as JSON: task payload and callback schemas, reason codes "
        "with FLIP's statuses, the job-id rule, the signature scheme",
    ).set_defaults(handler=None, plain=cmd_schema)

    _add_simulate(add)

    _add_api_and_ready(add)
    _add_process_commands(add)
    return parser


def _add_job_commands(
    add: Callable[[str, Handler | None, str], argparse.ArgumentParser],
    json_flag: Callable[[argparse.ArgumentParser], None],
) -> None:
    p = add("jobs", cmd_jobs, "list jobs, newest first")
    p.add_argument("--state", help="only jobs in this state (any case)")
    p.add_argument(
        "--limit", type=cli_args.jobs_limit, default=100, help="at most this many (default 100)"
    )
    json_flag(p)

    p = add("job", cmd_job, "one job with its history, by ID or by --key")
    p.add_argument(
        "job_id", type=cli_args.job_id, metavar="ID", nargs="?", help="the job's id (a UUID)"
    )
    p.add_argument("--key", help="the caller_key flip-api enqueued it with, instead of ID")
    json_flag(p)

    p = add("enqueue", cmd_enqueue, "queue a job (idempotent on --key)")
    p.add_argument("--key", required=True, help="the caller's idempotency key")
    p.add_argument("--definition", required=True, help="folder under JOB_ROOT, or s3:// URI")
    p.add_argument("--site", action="append", metavar="S", help="a required site (repeat)")
    p.add_argument("--net", help="run only on this net")
    p.add_argument("--priority", type=int, default=0, help="higher runs first (default 0)")
    p.add_argument("--max-attempts", type=int, default=None, help="default MAX_ATTEMPTS")
    p.add_argument(
        "--prewarm-key",
        metavar="K",
        help="the --key of a prewarm sent for this job: its claim prefers the net it holds",
    )
    p.add_argument(
        "--project",
        metavar="P",
        help="the FLIP project it belongs to (PROJECT_SHARES shares the nets between them)",
    )
    p.add_argument(
        "--metadata",
        type=cli_args.json_object,
        metavar="JSON",
        help="a JSON object kept with the job and sent in its callbacks "
        '(e.g. \'{"model_id": "m-42"}\')',
    )
    json_flag(p)

    p = add("abort", cmd_abort, "abort a job")
    p.add_argument("job_id", type=cli_args.job_id, metavar="ID", help="the job's id (a UUID)")
    p.add_argument(
        "--reason", default="aborted via the CLI", help="why, kept in its history (default: CLI)"
    )
    json_flag(p)


def _add_simulate(add: Callable[[str, Handler | None, str], argparse.ArgumentParser]) -> None:
    from app.sim import trace  # light: the standard library only

    p = add(
        "simulate", None, "replay a workload trace at each idle grace: server-hours saved, waits"
    )
    p.set_defaults(handler=None, plain=cmd_simulate)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "trace", nargs="?", type=Path, default=None, help="CSV or JSON lines (app/sim/README.md)"
    )
    source.add_argument(
        "--synthetic", action="store_true", help="generate a trace shaped like FLIP's load"
    )
    p.add_argument(
        "--grace",
        type=cli_args.graces,
        default=None,
        metavar="S,S,...",
        help="idle grace values in seconds (default 0,60,300,600,1800)",
    )
    p.add_argument(
        "--nets",
        default=None,
        metavar="N|A,B,...",
        help="how many nets, or their names (default: the trace's named nets, else 4)",
    )
    p.add_argument(
        "--cold-start",
        type=cli_args.cold_start,
        default="local",
        metavar="PROFILE",
        help="local (default), fargate, or PROVISION,LOGIN,SITES[,STOP] in seconds",
    )
    p.add_argument(
        "--wait-budget",
        type=cli_args.seconds_or_zero,
        default=None,
        metavar="S",
        help="p95 added wait a recommended grace may cost (default: one cold start as the"
        " dispatcher sees it, the profile's time + READY_POLL_S + AWAITED_POLL_S)",
    )
    p.add_argument(
        "--workers", type=cli_args.count, default=2, help="replays in parallel (default 2)"
    )
    p.add_argument("--plot", type=Path, default=None, metavar="PNG", help="write the plot here")
    p.add_argument(
        "--write-trace", type=Path, default=None, metavar="PATH", help="save the trace replayed"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    synthetic = p.add_argument_group("--synthetic")
    synthetic.add_argument(
        "--seed", type=int, default=0, help="random seed of the synthetic trace (default 0)"
    )
    synthetic.add_argument(
        "--days",
        type=cli_args.days,
        default=30.0,
        help="length of the synthetic trace (default 30)",
    )
    synthetic.add_argument(
        "--utilization",
        type=float,
        default=trace.FLIP_UTILIZATION,
        help=f"busy share per net (default {trace.FLIP_UTILIZATION:.3f}, FLIP's 16.4 h of 70.2 h)",
    )
    synthetic.add_argument(
        "--hinted",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="share of jobs sent with a prewarm hint, 0..1 (default 0: none)",
    )
    synthetic.add_argument(
        "--hint-lead",
        type=float,
        default=120.0,
        metavar="S",
        help="how long before its job a hint is sent (default 120)",
    )


def _add_api_and_ready(
    add: Callable[[str, Handler | None, str], argparse.ArgumentParser],
) -> None:
    p = add("api", cmd_api, "serve the status HTTP API")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    where.add_argument(
        "--host-of",
        action="append",
        metavar="NAME",
        help="bind this machine's own address NAME resolves to (an error if none; e.g. a "
        "compose network alias: one network of several); repeat for each network",
    )
    p.add_argument("--port", type=cli_args.port, default=8080, help="port to bind (default 8080)")
    _wait_flag(p)
    p = add("ready", cmd_ready, "exit 0 if database and broker are reachable (healthcheck)")
    p.add_argument(
        "--timeout",
        type=cli_args.seconds,
        default=5.0,
        metavar="S",
        help="per-check deadline (default 5)",
    )
    p.add_argument(
        "--beat-ticked-within",
        type=cli_args.seconds,
        default=None,
        metavar="S",
        help="also fail unless this data folder's beat ticked within S seconds",
    )


def _wait_flag(
    p: argparse.ArgumentParser, what: str = "the database at the migrations' head and the broker"
) -> None:
    p.add_argument(
        "--wait",
        type=cli_args.seconds_or_zero,
        default=0.0,
        metavar="S",
        help=f"first wait up to S seconds for {what} (default 0: do not wait)",
    )


def _add_process_commands(
    add: Callable[[str, Handler | None, str], argparse.ArgumentParser],
) -> None:
    p = add("worker", cmd_worker, "run a Celery worker (its tasks show live in Celery Flower)")
    p.add_argument(
        "--concurrency",
        type=cli_args.count,
        default=2,
        metavar="N",
        help="worker processes (default 2)",
    )
    p.add_argument("--beat", action="store_true", help="embed beat (only with ONE worker)")
    p.add_argument(
        "-Q",
        "--queues",
        type=_queue_list,
        default=[],
        metavar="Q1,Q2",
        help='consume only these queues (default: all; app/usecases/README.md "Queues")',
    )
    _wait_flag(p)
    _wait_flag(add("beat", cmd_beat, "run Celery beat (exactly one active per deployment)"))
    p = add("participant", None, "run the NVFLARE server or site of a startup kit (containers)")
    p.set_defaults(handler=None, plain=cmd_participant)
    p.add_argument("kit", type=Path, metavar="KIT_DIR", help="the participant's folder")
    p = add("demo", cmd_demo, "run the main job end to end on the embedded default")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    p.add_argument(
        "--idle-gap",
        type=cli_args.seconds_or_zero,
        default=5.0,
        metavar="S",
        help="pause between the two jobs",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the work folder: its fl-dispatcher.env shows what ran (status --env-file)",
    )
    p.add_argument(
        "--backend",
        choices=("nvflare", "flower"),
        default="nvflare",
        help="the net's backend: NVFLARE (server + 2 sites) or Flower (SuperLink + 2 "
        "SuperNodes, flwr from FLWR_VENV or made from .ci/flower.lock)",
    )
    _add_local_net(add)


def _add_local_net(add: Callable[[str, Handler | None, str], argparse.ArgumentParser]) -> None:
    p = add(
        "local-net",
        None,
        "provision a local NVFLARE net (server, admin, N sites) into a new folder, with its "
        "settings and a tiny job; print its nets entry",
    )
    p.set_defaults(handler=None, plain=cmd_local_net)
    p.add_argument("folder", type=Path, metavar="DIR", help="a new (or empty) folder")
    p.add_argument("--name", default="local-net", help="the net's name (default local-net)")
    p.add_argument(
        "--sites", type=cli_args.sites, default=2, metavar="N", help="how many sites (default 2)"
    )
    p.add_argument(
        "--port",
        type=cli_args.port,
        default=None,
        help="the server's port on 127.0.0.1 (default: one free now), written into the kits",
    )
    p.add_argument(
        "--admin", default="admin@nvidia.com", help="the admin user (default admin@nvidia.com)"
    )


def _queue_list(text: str) -> list[str]:
    """`-Q a,b`: names from app.names only, so a typo is an error at start, not a worker
    that silently consumes a queue nobody sends to."""
    from app import names

    queues = [q.strip() for q in text.split(",") if q.strip()]
    unknown = [q for q in queues if q not in names.QUEUES]
    if unknown or not queues:
        raise argparse.ArgumentTypeError(
            f"unknown queue(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(names.QUEUES)}"
        )
    return queues


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fl-dispatcher` console script."""
    # First, for every command: the servers the local drivers start run job code as this
    # user, and must not read this process's environment (app/process_guard.py).
    refuse_same_user_inspection()
    args = build_parser().parse_args(argv)
    plain = getattr(args, "plain", None)
    if plain is not None:
        # Static output from the code (diagrams, schemas): needs no configuration.
        return int(plain(args))
    from app.logs import configure_logging
    from app.settings import load_settings, use_env_file

    if args.env_file is not None:
        use_env_file(args.env_file)  # also for the processes a worker or the api starts
    try:
        settings = load_settings()
        configure_logging(settings)
    except SettingsError as exc:
        sys.stderr.write(f"fl-dispatcher: {exc}\n")
        return EXIT_SETTINGS
    handler: Handler = args.handler
    if not getattr(args, "json", False):
        return _run(handler, args, settings)
    JSON_STDOUT["out"] = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return _run(handler, args, settings)
    finally:
        JSON_STDOUT.clear()


def _run(handler: Handler, args: argparse.Namespace, settings: Settings) -> int:
    try:
        return handler(args, settings)
    except RequestRejected as exc:
        sys.stderr.write(f"fl-dispatcher: {exc} (reason_code: {exc.reason_code})\n")
        return EXIT_FAILED
    except DispatcherError as exc:  # NotFound, InvalidRequest, misconfiguration: say so
        sys.stderr.write(f"fl-dispatcher: {exc}\n")
        return EXIT_FAILED
    except DBAPIError as exc:
        # The driver's own first line (e.g. "connection refused"); not the SQL or its values.
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        if _missing_table(reason):
            where = redact_url(settings.database_url)
            sys.stderr.write(
                f"fl-dispatcher: the database has no fl-dispatcher tables ({reason}): "
                f"run `fl-dispatcher db upgrade` on {where}\n"
            )
            return EXIT_FAILED
        sys.stderr.write(f"fl-dispatcher: database error: {reason}\n")
        return EXIT_FAILED


def _missing_table(reason: str) -> bool:
    # SQLite: "no such table: jobs"; PostgreSQL: 'relation "jobs" does not exist'.
    return reason.startswith("no such table") or (
        reason.startswith("relation ") and reason.endswith("does not exist")
    )


if __name__ == "__main__":
    sys.exit(main())

"""`fl-dispatcher`: the operator's command line.

Human tables by default, `--json` for scripts. Every command builds Settings once from the
environment; a settings error prints its message and exits 2. Commands call the same use
cases (`app.usecases.intake`) and read models (`app.usecases.views`) as the status API, and
print no secrets (configuration is shown through `Settings.redacted()`). Only `api` loads
the HTTP stack (FastAPI, uvicorn); heavy imports stay inside the command that needs them.

Exit codes: 0 ok, 1 the command failed (not found, bad input, unreachable), 2 settings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.exc import DBAPIError

from app.errors import DispatcherError, InvalidRequest, RequestRejected, SettingsError
from app.runtime import Runtime
from app.settings import Settings, redact_url

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_SETTINGS = 2

Handler = Callable[[argparse.Namespace, Settings], int]


# --- output ------------------------------------------------------------------------------


# With --json, stdout carries the JSON document and nothing else: main() sends whatever else
# is printed there to stderr (NVFLARE 2.9's admin client prints "Connecting to FLARE ..."
# to stdout while a net is probed) and keeps the real stdout here for the document.
_JSON_STDOUT: dict[str, TextIO] = {}


def _print_json(data: Any, out: TextIO) -> None:
    out = _JSON_STDOUT.get("out", out)
    out.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    out.flush()


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO) -> None:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def _when(iso: str | None) -> str:
    # Seconds precision is plenty on a terminal.
    return iso[:19].replace("T", " ") if iso else "-"


# --- commands ----------------------------------------------------------------------------


def cmd_config_check(args: argparse.Namespace, settings: Settings) -> int:
    """Print the effective configuration with secrets masked, and for each net whether its
    admin kit names another server (`kit_problem`)."""
    from app.adapters.nvflare.kit_check import kit_endpoint_problem

    data = settings.redacted()
    for net in data["nets"]:
        net["kit_problem"] = kit_endpoint_problem(settings.net(net["name"]))
    if settings.data_dir_defaulted:
        sys.stderr.write(
            f"fl-dispatcher: warning: FL_DISPATCHER_DATA_DIR is unset, so the data folder is "
            f"{settings.data_dir} (.fl-dispatcher under the current directory): set it to "
            "use one folder whatever directory a command runs from\n"
        )
    if args.json:
        _print_json(data, sys.stdout)
        return EXIT_OK if all(n.get("kit_problem") is None for n in data["nets"]) else EXIT_SETTINGS
    for key, value in data.items():
        if key != "nets":
            sys.stdout.write(f"{key} = {value}\n")
    sys.stdout.write(f"nets: {len(data['nets'])}\n")
    for net in data["nets"]:
        sys.stdout.write(f"  {net['name']}: {json.dumps(net, sort_keys=True)}\n")
    problems = [(n.name, p) for n in settings.nets if (p := kit_endpoint_problem(n)) is not None]
    for name, problem in problems:
        sys.stderr.write(f"fl-dispatcher: net {name}: {problem}\n")
    if problems:
        return EXIT_SETTINGS
    sys.stdout.write("configuration ok\n")
    return EXIT_OK


def _runtime(settings: Settings) -> Runtime:
    """For commands that only read (nothing is sent: the outbox is a recorder)."""
    return Runtime.from_settings(settings)


def _sending_runtime(settings: Settings) -> Runtime:
    """For commands that write and then tell the workers (through the broker)."""
    from app.celery_app import celery_runtime

    return celery_runtime(settings)


def _warn_unsent(notified: bool | None) -> None:
    # The row is committed; only the nudge was lost, and beat's assigner or the
    # reconciler finds the row on its next tick (the outbox logged the broker's error).
    if notified is False:
        sys.stderr.write("warning: the workers were not told; beat will find the job\n")


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    """Every net (and its active job) and the queue."""
    from app.parallel import Prober
    from app.usecases.views import collect_status

    runtime = _runtime(settings)
    try:
        prober = None if args.no_probe else Prober()
        status = collect_status(runtime, prober, args.probe_timeout)
    finally:
        runtime.close()
    if args.json:
        _print_json(status, sys.stdout)
        return EXIT_OK
    rows = []
    for net in status["nets"]:
        driver = net["driver"]
        active = net["active_job"]
        rows.append(
            [
                net["name"],
                net["state"],
                "yes" if net["always_on"] else "no",
                f"{net['driver_kind']} {driver['desired']}/{driver['running']}/{driver['pending']}"
                if driver
                else net["driver_kind"],
                net["server_state"],
                ",".join(net["connected_sites"]) if net["connected_sites"] is not None else None,
                f"{active['id']} {active['state']}" if active else None,
                _hold(net["prewarm"]),
                net["error"] or net["last_error"],
            ]
        )
    _table(
        [
            "NET",
            "STATE",
            "ALWAYS-ON",
            "DRIVER d/r/p",
            "SERVER",
            "SITES",
            "ACTIVE JOB",
            "PREWARM",
            "ERROR",
        ],
        rows,
        sys.stdout,
    )
    queue = status["queue"]
    sys.stdout.write(
        f"\nqueued jobs: {queue['queued']}"
        + (f" (oldest since {_when(queue['oldest_queued_at'])})" if queue["queued"] else "")
        + "\n"
    )
    return EXIT_OK


def _hold(hold: dict[str, Any] | None) -> str | None:
    if hold is None:
        return None
    return f"{hold['caller_key']} {hold['status']} until {_when(hold['hold_until'])}"


def cmd_jobs(args: argparse.Namespace, settings: Settings) -> int:
    """Jobs, newest first."""
    from app.usecases.views import list_jobs, parse_job_state

    state = parse_job_state(args.state) if args.state else None
    runtime = _runtime(settings)
    try:
        with runtime.sessions() as session:
            jobs = list_jobs(session, state, args.limit)
    finally:
        runtime.close()
    if args.json:
        _print_json(jobs, sys.stdout)
        return EXIT_OK
    _table(
        ["ID", "STATE", "CODE", "NET", "KEY", "PRIO", "ATTEMPTS", "CREATED", "ERROR"],
        [
            [
                j["id"],
                j["state"],
                j["reason_code"],
                j["net"] or j["requested_net"],
                j["caller_key"],
                j["priority"],
                f"{j['attempts']}/{j['max_attempts']}",
                _when(j["created_at"]),
                j["last_error"],
            ]
            for j in jobs
        ],
        sys.stdout,
    )
    return EXIT_OK


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fl-dispatcher")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _job_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a job id (a UUID)") from None


def cmd_job(args: argparse.Namespace, settings: Settings) -> int:
    """One job with its history, by id or by caller key."""
    from app.usecases.views import job_detail, job_detail_by_key

    if (args.job_id is None) == (args.key is None):
        sys.stderr.write("fl-dispatcher: job: give a job ID or --key, not both\n")
        return EXIT_FAILED
    runtime = _runtime(settings)
    try:
        with runtime.sessions() as session:
            if args.key is not None:
                job = job_detail_by_key(session, args.key, callbacks=settings.callbacks_enabled)
            else:
                job = job_detail(session, args.job_id, callbacks=settings.callbacks_enabled)
    finally:
        runtime.close()
    if args.json:
        _print_json(job, sys.stdout)
        return EXIT_OK
    history = job.pop("history")
    for key, value in job.items():
        sys.stdout.write(f"{key:17} {'-' if value is None else value}\n")
    sys.stdout.write("\nhistory:\n")
    _table(
        ["AT", "FROM", "TO", "CODE", "REASON"],
        [
            [_when(e["at"]), e["from_state"], e["to_state"], e["reason_code"], e["reason"]]
            for e in history
        ],
        sys.stdout,
    )
    return EXIT_OK


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    """Queue a job (idempotent on --key), then ask a worker to assign it."""
    from pydantic import ValidationError

    from app.schemas import EnqueueJob
    from app.usecases import intake

    try:
        request = EnqueueJob(
            caller_key=args.key,
            definition=args.definition,
            required_sites=args.site or [],
            net=args.net,
            priority=args.priority,
            max_attempts=args.max_attempts,
            metadata=args.metadata,
        )
    except ValidationError as exc:
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            sys.stderr.write(f"fl-dispatcher: enqueue: {field}: {err['msg']}\n")
        return EXIT_FAILED
    runtime = _sending_runtime(settings)
    try:
        submitted = intake.submit_job(runtime, request)
    finally:
        runtime.close()
    result = submitted.enqueued
    data = {
        "job_id": str(result.job_id),
        "state": result.state.value,
        "created": result.created,
        "notified": submitted.notified,
    }
    if args.json:
        _print_json(data, sys.stdout)
    else:
        verb = "queued" if result.created else "already known"
        sys.stdout.write(f"{verb}: job {result.job_id} ({result.state.value})\n")
    _warn_unsent(submitted.notified)
    return EXIT_OK


def cmd_abort(args: argparse.Namespace, settings: Settings) -> int:
    """Abort a job; an active one is aborted on its server by the worker."""
    from app.schemas import AbortJob
    from app.usecases import intake

    request = AbortJob(job_id=args.job_id, reason=args.reason)
    runtime = _sending_runtime(settings)
    try:
        requested = intake.request_abort(runtime, request.job_id, request.reason)
    finally:
        runtime.close()
    decision = requested.decision
    data = {
        "job_id": str(decision.job_id),
        "state": decision.state.value,
        "needs_server_abort": decision.needs_server_abort,
        "notified": requested.notified,
    }
    if args.json:
        _print_json(data, sys.stdout)
    else:
        then = "; the worker aborts it on its server" if decision.needs_server_abort else ""
        sys.stdout.write(f"job {decision.job_id}: {decision.state.value}{then}\n")
    _warn_unsent(requested.notified)
    return EXIT_OK


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
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            sys.stderr.write(f"fl-dispatcher: prewarm: {field}: {err['msg']}\n")
        return EXIT_FAILED
    runtime = _sending_runtime(settings)
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
        answer = view | {"created": requested.created, "notified": requested.notified}
        _print_json(answer, sys.stdout)
    else:
        verb = "prewarm accepted" if requested.created else "already known"
        sys.stdout.write(
            f"{verb}: net {view['net']} {view['status']} until {_when(view['hold_until'])}"
            f" ({view['detail'] or view['status']})\n"
        )
    if requested.notified is False:
        sys.stderr.write("warning: the workers were not told; beat will start the server\n")
    return EXIT_OK


def cmd_cancel_prewarm(args: argparse.Namespace, settings: Settings) -> int:
    """End a prewarm's hold now; the net's idle grace starts."""
    from app.usecases import prewarm

    runtime = _runtime(settings)
    try:
        view = prewarm.cancel_prewarm(runtime, args.key)
    finally:
        runtime.close()
    if args.json:
        _print_json(view, sys.stdout)
    else:
        sys.stdout.write(f"prewarm {view['caller_key']}: {view['status']} (net {view['net']})\n")
    return EXIT_OK


def _fold_metrics_backlog(database_url: str) -> int:
    # History written before the running totals existed (or while nothing scraped) is
    # counted now, in batches, so no /metrics scrape has to.
    from app.db import make_engine, session_factory
    from app.metrics import catch_up

    engine = make_engine(database_url)
    try:
        return catch_up(session_factory(engine))
    finally:
        engine.dispose()


def cmd_db(args: argparse.Namespace, settings: Settings) -> int:
    """Alembic upgrade / downgrade / drift check on DATABASE_URL."""
    # Alembic 1.16+ logs one INFO line per autogenerate plugin it sets up, on every command:
    # noise around the one line that matters. Its migration lines stay.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    from app import migrate
    from app.settings import redact_url

    target = redact_url(settings.database_url)
    if args.db_command == "upgrade":
        _wait_for(args, settings, schema=False, broker=False)
        migrate.upgrade(settings.database_url, args.revision)
        sys.stdout.write(f"database at {args.revision}: {target}\n")
        if args.revision == "head":
            folded = _fold_metrics_backlog(settings.database_url)
            if folded:
                sys.stdout.write(f"metrics: {folded} history rows counted into the totals\n")
    elif args.db_command == "downgrade":
        migrate.downgrade(settings.database_url, args.revision)
        sys.stdout.write(f"database downgraded to {args.revision}: {target}\n")
    else:
        from alembic.util import AutogenerateDiffsDetected, CommandError

        try:
            migrate.check(settings.database_url)
        except (AutogenerateDiffsDetected, CommandError) as exc:
            sys.stderr.write(f"fl-dispatcher: db check: {exc}\n")
            return EXIT_FAILED
        sys.stdout.write(f"models and migrations agree: {target}\n")
    return EXIT_OK


def cmd_diagram(args: argparse.Namespace) -> int:
    """The two state diagrams (Mermaid), generated from the transition tables."""
    from models import JOB_TRANSITIONS, NET_TRANSITIONS
    from models.states import mermaid

    for title, table in (("Job", JOB_TRANSITIONS), ("Net", NET_TRANSITIONS)):
        sys.stdout.write(f"### {title} states\n\n```mermaid\n{mermaid(table)}\n```\n\n")
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    """The public contract (app.contract): task payloads, callbacks, reason codes, job ids,
    signatures."""
    from app.contract import contract_document

    _print_json(contract_document(), sys.stdout)
    return EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay a trace (or a synthetic one) at each idle grace: what scale-to-zero saves."""
    from app.sim import savings, trace

    try:
        if args.synthetic:
            # Sized for the nets it is replayed on: the utilization is per net.
            nets = savings.parse_nets(args.nets, trace.Trace(()))
            spec = trace.Synthetic(
                seed=args.seed, days=args.days, nets=len(nets), utilization=args.utilization
            )
            workload = trace.synthesize(spec)
        else:
            workload = trace.read_trace(args.trace)
            nets = savings.parse_nets(args.nets, workload)
        if args.write_trace is not None:
            trace.write_trace(workload, args.write_trace)
        report = savings.simulate(
            workload,
            nets,
            savings.DEFAULT_GRACES if args.grace is None else args.grace,
            args.cold_start,
            workers=args.workers,
            wait_budget_s=args.wait_budget,
        )
    except trace.TraceError as exc:
        sys.stderr.write("".join(f"fl-dispatcher: {line}\n" for line in exc.problems))
        return EXIT_FAILED
    except ValueError as exc:
        sys.stderr.write(f"fl-dispatcher: {exc}\n")
        return EXIT_FAILED
    if args.plot is not None:
        try:
            savings.plot(report, args.plot)
        except ImportError:
            sys.stderr.write(
                "fl-dispatcher: --plot needs matplotlib: pip install 'fl-dispatcher[plot]'\n"
            )
            return EXIT_FAILED
    if args.json:
        _print_json(report.to_json(), sys.stdout)
    else:
        sys.stdout.write(savings.table(report) + "\n")
    return EXIT_OK


def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the status API with uvicorn."""
    import uvicorn

    from app.entrypoints.api import create_app

    _wait_for(args, settings, schema=True, broker=True)
    app = create_app(_sending_runtime(settings), close_runtime=True)
    # log_config=None: keep the handler configure_logging installed (plain or JSON).
    uvicorn.run(app, host=args.host, port=args.port, log_config=None)
    return EXIT_OK


def cmd_ready(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 0 if the database and the broker answer (the /readyz checks) and, if asked,
    this data folder's beat ticked recently; for healthchecks."""
    from app.db import make_engine
    from app.parallel import Prober
    from app.readiness import check_ready

    engine = make_engine(settings.database_url)
    try:
        errors = check_ready(engine, settings.broker_url, Prober(), args.timeout)
    finally:
        engine.dispose()
    if args.beat_ticked_within is not None:
        from app.beat import heartbeat_age_s, heartbeat_path

        age = heartbeat_age_s(heartbeat_path(settings), time.time())
        errors["beat"] = (
            f"no tick for {age:.0f}s (more than {args.beat_ticked_within:.0f}s)"
            if age is not None and age > args.beat_ticked_within
            else "never ticked"
            if age is None
            else None
        )
    failed = {k: error for k, error in errors.items() if error is not None}
    for key, error in sorted(failed.items()):
        sys.stderr.write(f"fl-dispatcher: {key} not ready: {error}\n")
    if not failed:
        beat = ", beat ticking" if "beat" in errors else ""
        sys.stdout.write(f"database and broker reachable{beat}\n")
    return EXIT_FAILED if failed else EXIT_OK


def _wait_for(args: argparse.Namespace, settings: Settings, *, schema: bool, broker: bool) -> None:
    """`--wait S`: retry the process's dependencies for up to S seconds before starting."""
    if getattr(args, "wait", 0) > 0:
        from app.readiness import wait_for_dependencies

        wait_for_dependencies(settings, args.wait, schema=schema, broker=broker)


# --- processes: worker, beat, demo --------------------------------------------------------


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    """Run a Celery worker (with an embedded beat only if asked: one beat per deployment)."""
    from app.celery_app import run_worker

    _wait_for(args, settings, schema=True, broker=True)
    run_worker(settings, concurrency=args.concurrency, beat=args.beat, queues=args.queues)
    return EXIT_OK


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


def cmd_beat(args: argparse.Namespace, settings: Settings) -> int:
    """Run the deployment's one beat."""
    from app.celery_app import run_beat

    _wait_for(args, settings, schema=True, broker=True)
    run_beat(settings)
    return EXIT_OK


def cmd_participant(args: argparse.Namespace) -> int:
    """Become the NVFLARE participant (server or site) of a startup kit: the command its
    `startup/sub_start.sh --once` would exec, without nvflare's restart loop (a container's
    engine or the scale driver decides whether it runs). compose.yml's fl-server and sites."""
    import os

    from app.adapters.nvflare.participants import kit_command

    kit = args.kit.resolve()
    command = kit_command(kit)
    (kit / "transfer").mkdir(exist_ok=True)  # sub_start.sh creates it before exec
    os.chdir(kit)
    sys.stdout.flush()
    os.execv(command[0], command)  # noqa: S606 (the kit's own command line, as nvflare runs it)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Run the local end-to-end demo (its own settings; the environment's are not used)."""
    import logging

    # The demo prints its own story; library INFO lines (alembic, nvflare) would drown it.
    # Set before the import: alembic logs while its plugins load.
    logging.getLogger().setLevel(logging.WARNING)
    from app.local.demo import run_demo

    return run_demo(args.workdir, idle_gap_s=args.idle_gap, keep=args.keep)


# --- parser ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also used by tests to check compose.yml's commands)."""
    parser = argparse.ArgumentParser(
        prog="fl-dispatcher",
        description="Queue federated-learning jobs and scale each net's NVFLARE server.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
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
        "--probe-timeout", type=float, default=3.0, metavar="S", help="per-net probe deadline"
    )

    _add_job_commands(add, json_flag)
    _add_prewarm_commands(add, json_flag)

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
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    json_flag(p)

    p = add("job", cmd_job, "one job with its history, by ID or by --key")
    p.add_argument("job_id", type=_job_id, metavar="ID", nargs="?", help="the job's id (a UUID)")
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
        "--metadata",
        type=_json_object,
        metavar="JSON",
        help="a JSON object kept with the job and sent in its callbacks "
        '(e.g. \'{"model_id": "m-42"}\')',
    )
    json_flag(p)

    p = add("abort", cmd_abort, "abort a job")
    p.add_argument("job_id", type=_job_id, metavar="ID", help="the job's id (a UUID)")
    p.add_argument(
        "--reason", default="aborted via the CLI", help="why, kept in its history (default: CLI)"
    )
    json_flag(p)


def _add_prewarm_commands(
    add: Callable[[str, Handler | None, str], argparse.ArgumentParser],
    json_flag: Callable[[argparse.ArgumentParser], None],
) -> None:
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


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object ({...})")
    return value


def _graces(text: str) -> tuple[float, ...]:
    from app.sim.savings import parse_graces  # the simulator loads only for `simulate`

    return parse_graces(text)


def _cold_start(text: str) -> Any:
    from app.sim.savings import parse_cold_start

    return parse_cold_start(text)


def _add_simulate(add: Callable[[str, Handler | None, str], argparse.ArgumentParser]) -> None:
    from app.sim import trace  # light: the standard library only

    p = add(
        "simulate", None, "replay a workload trace at each idle grace: server-hours saved, waits"
    )
    p.set_defaults(handler=None, plain=cmd_simulate)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "trace", nargs="?", type=Path, default=None, help="CSV or JSON lines (README)"
    )
    source.add_argument(
        "--synthetic", action="store_true", help="generate a trace shaped like FLIP's load"
    )
    p.add_argument(
        "--grace",
        type=_graces,
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
        type=_cold_start,
        default="local",
        metavar="PROFILE",
        help="local (default), fargate, or PROVISION,LOGIN,SITES[,STOP] in seconds",
    )
    p.add_argument(
        "--wait-budget",
        type=float,
        default=None,
        metavar="S",
        help="p95 added wait a recommended grace may cost (default: one cold start as the"
        " dispatcher sees it, the profile's time + READY_POLL_S + QUEUED_POLL_S)",
    )
    p.add_argument("--workers", type=int, default=2, help="replays in parallel (default 2)")
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
        "--days", type=float, default=30.0, help="length of the synthetic trace (default 30)"
    )
    synthetic.add_argument(
        "--utilization",
        type=float,
        default=trace.FLIP_UTILIZATION,
        help=f"busy share per net (default {trace.FLIP_UTILIZATION:.3f}, FLIP's 16.4 h of 70.2 h)",
    )


def _add_api_and_ready(
    add: Callable[[str, Handler | None, str], argparse.ArgumentParser],
) -> None:
    p = add("api", cmd_api, "serve the status HTTP API")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to bind (default 8080)")
    _wait_flag(p)
    p = add("ready", cmd_ready, "exit 0 if database and broker are reachable (healthcheck)")
    p.add_argument(
        "--timeout", type=float, default=5.0, metavar="S", help="per-check deadline (default 5)"
    )
    p.add_argument(
        "--beat-ticked-within",
        type=float,
        default=None,
        metavar="S",
        help="also fail unless this data folder's beat ticked within S seconds",
    )


def _wait_flag(
    p: argparse.ArgumentParser, what: str = "the database at the migrations' head and the broker"
) -> None:
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help=f"first wait up to S seconds for {what} (default 0: do not wait)",
    )


def _add_process_commands(
    add: Callable[[str, Handler | None, str], argparse.ArgumentParser],
) -> None:
    p = add("worker", cmd_worker, "run a Celery worker (its tasks show live in Celery Flower)")
    p.add_argument(
        "--concurrency", type=int, default=2, metavar="N", help="worker processes (default 2)"
    )
    p.add_argument("--beat", action="store_true", help="embed beat (only with ONE worker)")
    p.add_argument(
        "-Q",
        "--queues",
        type=_queue_list,
        default=[],
        metavar="Q1,Q2",
        help='consume only these queues (default: all; README "Queues")',
    )
    _wait_flag(p)
    _wait_flag(add("beat", cmd_beat, "run Celery beat (exactly one active per deployment)"))
    p = add("participant", None, "run the NVFLARE server or site of a startup kit (containers)")
    p.set_defaults(handler=None, plain=cmd_participant)
    p.add_argument("kit", type=Path, metavar="KIT_DIR", help="the participant's folder")
    p = add("demo", cmd_demo, "run the main job end to end on the embedded default")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    p.add_argument(
        "--idle-gap", type=float, default=5.0, metavar="S", help="pause between the two jobs"
    )
    p.add_argument("--keep", action="store_true", help="keep the work folder")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fl-dispatcher` console script."""
    args = build_parser().parse_args(argv)
    plain = getattr(args, "plain", None)
    if plain is not None:
        # Static output from the code (diagrams, schemas): needs no configuration.
        return int(plain(args))
    from app.logs import configure_logging
    from app.settings import load_settings

    try:
        settings = load_settings()
        configure_logging(settings)
    except SettingsError as exc:
        sys.stderr.write(f"fl-dispatcher: {exc}\n")
        return EXIT_SETTINGS
    handler: Handler = args.handler
    if not getattr(args, "json", False):
        return _run(handler, args, settings)
    _JSON_STDOUT["out"] = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return _run(handler, args, settings)
    finally:
        _JSON_STDOUT.clear()


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

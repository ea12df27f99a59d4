"""`fl-dispatcher` commands on the configuration, the nets and the jobs: config check, status,
jobs, job, enqueue, abort. They call the same use cases and read models as the status API."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from functools import partial
from typing import TYPE_CHECKING

from app.db import missing_sqlite_file
from app.entrypoints.cli_output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SETTINGS,
    describe_drain,
    invalid_request,
    print_json,
    print_table,
    short_time,
)
from app.errors import NotFound
from app.runtime import Runtime
from app.settings import Settings
from models import JobState

if TYPE_CHECKING:
    from app.read_models import NetHold


def config_warnings(settings: Settings) -> list[str]:
    """What is valid but will not work as it stands: no net at all, an admin kit (a Flower
    net's CA, certificate or flwr) this process cannot read or verify, an unset data
    folder."""
    from app.adapters.net_check import files_problem

    warnings = []
    if settings.data_dir_defaulted:
        warnings.append(
            f"FL_DISPATCHER_DATA_DIR is unset, so the data folder is {settings.data_dir} "
            "(.fl-dispatcher under the current directory): set it to use one folder whatever "
            "directory a command runs from"
        )
    if not settings.nets:
        warnings.append(
            "no net is declared (NETS_FILE or NETS): every job would wait QUEUED; "
            "`fl-dispatcher local-net DIR` makes a local one and prints its entry"
        )
    for net in settings.nets:
        exc = files_problem(net, settings)
        if exc is not None:
            # Checked as this user: the workers may run as another (compose: uid 10001).
            warnings.append(
                f"net {net.name}: {exc} (read as uid {os.getuid()}); the net would be MISCONFIGURED"
            )
    return warnings


def cmd_config_check(args: argparse.Namespace, settings: Settings) -> int:
    """Print the effective configuration with secrets masked, and for each net whether its
    admin kit (a Flower net's SuperLink certificate) names another server (`kit_problem`);
    warn about what will not work."""
    from app.adapters.net_check import endpoint_problem

    # A kit config this user cannot read is a warning (below), not also a kit problem.
    problems = {
        n.name: p
        for n in settings.nets
        if (p := endpoint_problem(n, settings, unread_is_a_problem=False)) is not None
    }
    data = settings.redacted()
    for net in data["nets"]:
        net["kit_problem"] = problems.get(net["name"])
    warnings = config_warnings(settings)
    for warning in warnings:
        sys.stderr.write(f"fl-dispatcher: warning: {warning}\n")
    data["warnings"] = warnings
    if args.json:
        print_json(data, sys.stdout)
        return EXIT_OK if all(n.get("kit_problem") is None for n in data["nets"]) else EXIT_SETTINGS
    for key, value in data.items():
        if key not in ("nets", "warnings"):
            sys.stdout.write(f"{key} = {value}\n")
    sys.stdout.write(f"nets: {len(data['nets'])}\n")
    for net in data["nets"]:
        sys.stdout.write(f"  {net['name']}: {json.dumps(net, sort_keys=True)}\n")
    for name, problem in problems.items():
        sys.stderr.write(f"fl-dispatcher: net {name}: {problem}\n")
    if problems:
        return EXIT_SETTINGS
    if warnings:
        sys.stdout.write(f"configuration valid, with {len(warnings)} warning(s) on stderr\n")
    else:
        sys.stdout.write("configuration ok\n")
    return EXIT_OK


def _runtime(settings: Settings) -> Runtime:
    """For commands that only read (nothing is sent: the outbox is a recorder); they create
    nothing either, not even an empty embedded database."""
    missing = missing_sqlite_file(settings.database_url)
    if missing is not None:
        raise NotFound(
            f"no database at {missing}: nothing has run with these settings "
            f"(data folder {settings.data_dir}). `fl-dispatcher db upgrade` creates it; to "
            "look at a folder `demo --keep` or `local-net` made, read its settings: "
            "fl-dispatcher --env-file <folder>/fl-dispatcher.env <command>"
        )
    return Runtime.from_settings(settings)


def sending_runtime(settings: Settings) -> Runtime:
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
    from app.usecases.views import collect_status, undeclared_nets

    runtime = _runtime(settings)
    try:
        prober = None if args.no_probe else Prober()
        status = collect_status(runtime, prober, args.probe_timeout)
        with runtime.sessions() as session:
            others = undeclared_nets(session, [n.name for n in settings.nets])
    finally:
        runtime.close()
    if not settings.nets:
        sys.stderr.write("fl-dispatcher: no net is declared: set NETS_FILE or NETS\n")
    if others:
        # The database has them, these settings do not: a status without them would look
        # empty, and /metrics (read from the tables) would disagree with it.
        sys.stderr.write(
            f"fl-dispatcher: the database also holds net(s) these settings do not declare: "
            f"{', '.join(others)} (declared by other settings, e.g. a kept demo's "
            "fl-dispatcher.env: pass it with --env-file)\n"
        )
    if args.json:
        print_json(status.model_dump(mode="json"), sys.stdout)
        return EXIT_OK
    rows = []
    for net in status.nets:
        driver = net.driver
        active = net.active_job
        rows.append(
            [
                net.name,
                f"{net.state} (drained)" if net.drained else net.state,
                "yes" if net.always_on else "no",
                f"{net.driver_kind} {driver.desired}/{driver.running}/{driver.pending}"
                if driver
                else net.driver_kind,
                net.server_state,
                ",".join(net.connected_sites) if net.connected_sites is not None else None,
                f"{active.id} {active.state}" if active else None,
                _hold(net.prewarm),
                net.error or net.last_error,
            ]
        )
    print_table(
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
    queue = status.queue
    sys.stdout.write(
        f"\nqueued jobs: {queue.queued}"
        + (f" (oldest since {short_time(queue.oldest_queued_at)})" if queue.queued else "")
        + "\n"
    )
    if status.drain.state != "none":
        sys.stdout.write("\n".join(describe_drain(status.drain)) + "\n")
    return EXIT_OK


def _hold(hold: NetHold | None) -> str | None:
    if hold is None:
        return None
    return f"{hold.caller_key} {hold.status} until {short_time(hold.hold_until)}"


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
        print_json([j.model_dump(mode="json") for j in jobs], sys.stdout)
        return EXIT_OK
    print_table(
        ["ID", "STATE", "CODE", "NET", "KEY", "PRIO", "ATTEMPT", "CREATED", "ERROR"],
        [
            [
                j.id,
                j.state,
                j.reason_code,
                j.net or j.requested_net,
                j.caller_key,
                j.priority,
                f"{j.attempt} of {j.max_attempts}",
                short_time(j.created_at),
                j.last_error,
            ]
            for j in jobs
        ],
        sys.stdout,
    )
    return EXIT_OK


def cmd_job(args: argparse.Namespace, settings: Settings) -> int:
    """One job with its history, by id or by caller key."""
    from app.usecases.views import job_detail, job_detail_by_key

    if (args.job_id is None) == (args.key is None):
        sys.stderr.write("fl-dispatcher: job: give a job ID or --key, not both\n")
        return EXIT_FAILED
    runtime = _runtime(settings)
    detail = partial(job_detail, callbacks=settings.callbacks_enabled, settings=settings)
    by_key = partial(job_detail_by_key, callbacks=settings.callbacks_enabled, settings=settings)
    try:
        with runtime.sessions() as session:
            if args.key is not None:
                job = by_key(session, args.key, now=runtime.clock())
            else:
                job = detail(session, args.job_id, now=runtime.clock())
    finally:
        runtime.close()
    fields = job.model_dump(mode="json")
    if args.json:
        print_json(fields, sys.stdout)
        return EXIT_OK
    del fields["history"]
    # One attempt count, as the nets page and the callbacks show it (models.attempts).
    fields["attempt"] = f"{fields['attempt']} of {fields.pop('max_attempts')}"
    fields.pop("attempts")
    for key, value in fields.items():
        sys.stdout.write(f"{key:17} {'-' if value is None else value}\n")
    sys.stdout.write("\nhistory:\n")
    print_table(
        ["AT", "FROM", "TO", "ATTEMPT", "CODE", "REASON"],
        [
            [short_time(e.at), e.from_state, e.to_state, e.attempt, e.reason_code, e.reason]
            for e in job.history
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
            prewarm_key=args.prewarm_key,
            project_id=args.project,
        )
    except ValidationError as exc:
        return invalid_request("enqueue", exc, sys.stderr)
    runtime = sending_runtime(settings)
    try:
        submitted = intake.submit_job(runtime, request)
    finally:
        runtime.close()
    result = submitted.enqueued
    if args.json:
        print_json(submitted.answer().model_dump(mode="json"), sys.stdout)
    else:
        sys.stdout.write(_enqueued_line(result.job_id, result.created, result.state))
    _warn_unsent(submitted.notified)
    return EXIT_OK


def _enqueued_line(job_id: uuid.UUID, created: bool, state: JobState) -> str:
    """The enqueue's answer in one line: a job created ABORTED met an abort kept for it."""
    if created and state == JobState.ABORTED:
        return f"stored, aborted at once (an abort came first): job {job_id}\n"
    verb = "queued" if created else "already known"
    return f"{verb}: job {job_id} ({state.value})\n"


def cmd_abort(args: argparse.Namespace, settings: Settings) -> int:
    """Abort a job; an active one is aborted on its server by the worker."""
    from pydantic import ValidationError

    from app.schemas import AbortJob
    from app.usecases import intake

    try:
        request = AbortJob(job_id=args.job_id, reason=args.reason)
    except ValidationError as exc:
        return invalid_request("abort", exc, sys.stderr)
    runtime = sending_runtime(settings)
    try:
        requested = intake.request_abort(runtime, request.job_id, request.reason)
    finally:
        runtime.close()
    decision = requested.decision
    if args.json:
        print_json(requested.answer().model_dump(mode="json"), sys.stdout)
    else:
        then = "; the worker aborts it on its server" if decision.needs_server_abort else ""
        sys.stdout.write(f"job {decision.job_id}: {decision.state.value}{then}\n")
    _warn_unsent(requested.notified)
    return EXIT_OK

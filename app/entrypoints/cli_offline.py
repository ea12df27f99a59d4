"""`fl-dispatcher` commands answered from the code alone, without settings: the state
diagrams, the public contract, the savings simulator."""

from __future__ import annotations

import argparse
import sys

from app.entrypoints.cli_output import EXIT_FAILED, EXIT_OK, print_json


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

    print_json(contract_document(), sys.stdout)
    return EXIT_OK


def _progress(line: str) -> None:
    """simulate's progress, on stderr: stdout carries only the report (--json)."""
    sys.stderr.write(f"fl-dispatcher simulate: {line}\n")
    sys.stderr.flush()


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay a trace (or a synthetic one) at each idle grace: what scale-to-zero saves."""
    from app.sim import savings, savings_args, savings_table, trace

    try:
        if args.synthetic:
            # Sized for the nets it is replayed on: the utilization is per net.
            nets = savings_args.parse_nets(args.nets, trace.Trace(()))
            spec = trace.Synthetic(
                seed=args.seed,
                days=args.days,
                nets=len(nets),
                utilization=args.utilization,
                hinted=args.hinted,
                hint_lead_s=args.hint_lead,
            )
            workload = trace.synthesize(spec)
        else:
            workload = trace.read_trace(args.trace)
            nets = savings_args.parse_nets(args.nets, workload)
        if args.write_trace is not None:
            trace.write_trace(workload, args.write_trace)
        report = savings.simulate(
            workload,
            nets,
            savings.DEFAULT_GRACES if args.grace is None else args.grace,
            args.cold_start,
            workers=args.workers,
            wait_budget_s=args.wait_budget,
            progress=_progress,
        )
    except trace.TraceError as exc:
        sys.stderr.write("".join(f"fl-dispatcher: {line}\n" for line in exc.problems))
        return EXIT_FAILED
    except ValueError as exc:
        sys.stderr.write(f"fl-dispatcher: {exc}\n")
        return EXIT_FAILED
    if args.plot is not None:
        try:
            savings_table.plot(report, args.plot)
        except ImportError:
            sys.stderr.write(
                "fl-dispatcher: --plot needs matplotlib: pip install 'fl-dispatcher[plot]'\n"
            )
            return EXIT_FAILED
    if args.json:
        print_json(report.to_json(), sys.stdout)
    else:
        sys.stdout.write(savings_table.table(report) + "\n")
    return EXIT_OK

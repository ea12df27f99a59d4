"""What every housekeeping loop shares: one net's failure is isolated (logged, recorded on
the net, never stopping the loop for the others), and a round that talks to every net in
parallel has one deadline. The loops themselves: `monitor` (running jobs), `scale_down` (idle
and busy nets), `reconciler` (stuck work and drift)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from app.db import unit_of_work
from app.runtime import Runtime
from models import Net

log = logging.getLogger(__name__)


@contextmanager
def isolated(rt: Runtime, loop: str, net_name: str) -> Iterator[None]:
    """One net's failure in a housekeeping loop is logged (one ERROR line with the net and
    the loop) and recorded on that net (`last_error`, shown by /fl/status and the CLI), never
    allowed to stop the loop for the others."""
    try:
        yield
    except Exception as exc:
        log.exception("housekeeping failed for one net", extra={"net": net_name, "loop": loop})
        try:
            with unit_of_work(rt.sessions) as session:
                net = session.get(Net, net_name)
                if net is not None:
                    net.last_error = f"{loop}: {type(exc).__name__}: {exc}"[:2000]
        except Exception:
            log.exception("recording a net's failure failed", extra={"net": net_name})


# How much longer than one admin command a round waits (its size is a judgement, not a rule).
ROUND_MARGIN_S = 2.0


def round_deadline_s(rt: Runtime) -> float:
    """How long a round waits for its nets' answers before reporting the late ones."""
    # Each net is talked to on its own (in parallel in a worker): one hung server costs the
    # round one command timeout, not one per net. A net still busy past this is reported
    # and left to finish in the background (at most one call per net at a time).
    return rt.settings.admin_command_timeout_s + ROUND_MARGIN_S

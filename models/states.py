"""The two state machines: states and the ONE table of allowed moves for each.

Docs and the diagrams of app/usecases/README.md are checked against these tables
(tests/unit/test_states.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class JobState(StrEnum):
    """Lifecycle of a training job."""

    QUEUED = "QUEUED"
    ASSIGNED = "ASSIGNED"  # a net is reserved; its server may still be scaling up
    DISPATCHING = "DISPATCHING"  # server ready, submit in flight (submit token stored first)
    RUNNING = "RUNNING"
    # NVFLARE finished the run; the server is held (net BUSY) until flip-api reports that the
    # results were uploaded from its disk, or REPORT_TIMEOUT_S passes (release_after=reported).
    FINISHING = "FINISHING"
    ABORTING = "ABORTING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    ABORTED = "ABORTED"


class NetState(StrEnum):
    """Lifecycle of a net's fl-server."""

    STOPPED = "STOPPED"
    STARTING = "STARTING"
    READY = "READY"
    BUSY = "BUSY"
    STOPPING = "STOPPING"
    UNHEALTHY = "UNHEALTHY"  # scale-up or readiness failed past its deadline
    OUTAGE = "OUTAGE"  # an always-on net whose server is unreachable
    MISCONFIGURED = "MISCONFIGURED"  # wrong kit, wrong server, missing service: needs a human


J = JobState
N = NetState

JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    J.QUEUED: frozenset({J.ASSIGNED, J.ABORTED, J.FAILED}),
    J.ASSIGNED: frozenset({J.DISPATCHING, J.QUEUED, J.FAILED, J.ABORTED}),
    # DISPATCHING -> ABORTING: the submit may have reached the server, so abort it there.
    J.DISPATCHING: frozenset({J.RUNNING, J.QUEUED, J.FAILED, J.ABORTING, J.ABORTED}),
    # RUNNING -> QUEUED: the server was lost under the job and the policy is "requeue".
    J.RUNNING: frozenset({J.COMPLETED, J.FAILED, J.ABORTED, J.ABORTING, J.QUEUED, J.FINISHING}),
    J.FINISHING: frozenset({J.COMPLETED, J.FAILED, J.ABORTED}),
    # ABORTING -> COMPLETED/FAILED: the job finished before the abort took effect.
    J.ABORTING: frozenset({J.ABORTED, J.COMPLETED, J.FAILED}),
    J.COMPLETED: frozenset(),
    J.FAILED: frozenset(),
    J.ABORTED: frozenset(),
}

NET_TRANSITIONS: Mapping[NetState, frozenset[NetState]] = {
    # STOPPED -> STOPPING: reconcile takes down a server that runs while the net is STOPPED
    # (drift), holding the state that no claimer may assign.
    N.STOPPED: frozenset({N.STARTING, N.READY, N.OUTAGE, N.MISCONFIGURED, N.STOPPING}),
    N.STARTING: frozenset({N.READY, N.UNHEALTHY, N.MISCONFIGURED, N.STOPPING, N.STOPPED, N.OUTAGE}),
    N.READY: frozenset({N.BUSY, N.STOPPING, N.STOPPED, N.OUTAGE, N.UNHEALTHY, N.MISCONFIGURED}),
    N.BUSY: frozenset({N.READY, N.STOPPED, N.OUTAGE, N.UNHEALTHY, N.MISCONFIGURED}),
    # STOPPING/UNHEALTHY -> OUTAGE or READY: PER_JOB_FL_SERVER was turned off across a
    # redeploy, so the net is always-on now whatever it was doing.
    N.STOPPING: frozenset({N.STOPPED, N.UNHEALTHY, N.OUTAGE, N.READY, N.MISCONFIGURED}),
    N.UNHEALTHY: frozenset({N.STOPPING, N.STOPPED, N.STARTING, N.READY, N.OUTAGE, N.MISCONFIGURED}),
    N.OUTAGE: frozenset({N.READY, N.BUSY, N.STOPPED, N.STOPPING, N.MISCONFIGURED}),
    N.MISCONFIGURED: frozenset({N.STOPPED, N.STARTING, N.READY, N.OUTAGE, N.STOPPING}),
}

ACTIVE_JOB_STATES: frozenset[JobState] = frozenset(
    {J.ASSIGNED, J.DISPATCHING, J.RUNNING, J.FINISHING, J.ABORTING}
)
TERMINAL_JOB_STATES: frozenset[JobState] = frozenset({J.COMPLETED, J.FAILED, J.ABORTED})
# A net in one of these states may be handed a new job if no job is active on it. STARTING
# is included: a job aborted while its net scaled up leaves the net coming up for the next.
ASSIGNABLE_NET_STATES: frozenset[NetState] = frozenset({N.STOPPED, N.STARTING, N.READY})


class IllegalTransition(Exception):
    """A move that the state machine's table does not allow."""

    def __init__(self, kind: str, ident: str, current: StrEnum, target: StrEnum) -> None:
        super().__init__(f"{kind} {ident}: {current} -> {target} is not allowed")
        self.current = current
        self.target = target


def mermaid(
    table: Mapping[JobState, frozenset[JobState]] | Mapping[NetState, frozenset[NetState]],
) -> str:
    """A Mermaid state diagram generated from a transition table (app/usecases/README.md
    embeds it)."""
    lines = ["stateDiagram-v2"]
    for source, targets in table.items():
        lines.extend(f"    {source} --> {target}" for target in sorted(targets))
    return "\n".join(lines)

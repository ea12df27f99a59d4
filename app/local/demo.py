"""`fl-dispatcher demo`: the main job end to end on the embedded default.

Provisions a local NVFLARE deployment (server + 2 sites), starts a real worker with beat on
SQLite (tables and broker), enqueues a job, watches the server come up, the job run, the
server held (FINISHING) until a stand-in for flip-api reports the results uploaded, and the
server scale to zero; after an idle gap does it all again; prints every job and net state
change live and ends with a summary. A tiny local receiver stands in for flip-api's
callback endpoint (loopback, a free port, a CALLBACK_SECRET made for the run): each signed
status callback is printed as it arrives, and counted at the end. Leaves no process behind.

With `--backend flower` the net is a Flower net instead (issue 38): a SuperLink the worker's
local driver starts from flwr's own virtualenv (FLWR_VENV, else the checkout's, made from
`.ci/flower.lock` as the tests make it: app/local/flower.py), with TLS and SuperNode
authentication, and two SuperNodes registered by site name and left running; the job is a
tiny Flower App; the rest is the same story.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from sqlalchemy import func, select

from app.local.receiver import LocalReceiver, Received
from app.local.settings_folder import ENV_FILE, NETS_FILE, shell_word
from app.local.stack import JOB_NAME, NET, LocalStack, StackOptions
from app.schemas import ReportedStatus
from models import JobEvent, JobState, NetEvent, NetState

RUN_TIMEOUT_S = 600.0
UPLOAD_S = 3.0  # how long the demo's stand-in for flip-api takes to "upload" results
CALLBACKS_SETTLE_S = 30.0  # how long the end waits for the last callbacks to arrive


class TextOut(Protocol):
    """Where the demo prints (sys.stdout, or a test's StringIO)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class SharedOut:
    """Whole lines from two threads (the main loop and the callback receiver) never mix."""

    def __init__(self, out: TextOut) -> None:
        self._out = out
        self._lock = threading.Lock()

    def write(self, text: str, /) -> int:
        with self._lock:
            written = self._out.write(text)
            self._out.flush()
            return written

    def flush(self) -> None:
        with self._lock:
            self._out.flush()


@dataclass
class Timeline:
    """Every state change seen, for the live print and the summary."""

    started: float = field(default_factory=time.monotonic)
    job_events: list[JobEvent] = field(default_factory=list)
    net_events: list[NetEvent] = field(default_factory=list)
    last_job_event: int = 0
    last_net_event: int = 0

    def first(
        self, events: list[NetEvent], state: NetState, after: datetime | None = None
    ) -> datetime | None:
        """The first net event into `state` (after a moment, if given)."""
        return next(
            (e.at for e in events if e.to_state == state and (after is None or e.at >= after)),
            None,
        )


def _poll(stack: LocalStack, timeline: Timeline, out: TextOut) -> None:
    jobs, nets = stack.events_since(timeline.last_job_event, timeline.last_net_event)
    merged: list[tuple[datetime, str]] = []
    for event in jobs:
        timeline.last_job_event = event.id
        timeline.job_events.append(event)
        merged.append(
            (
                event.at,
                f"job {str(event.job_id)[:8]}  {event.from_state or '-':>11} -> "
                f"{event.to_state:<11} {event.reason}",
            )
        )
    for net_event in nets:
        timeline.last_net_event = net_event.id
        timeline.net_events.append(net_event)
        merged.append(
            (
                net_event.at,
                f"net {net_event.net_name}  {net_event.from_state or '-':>9} "
                f"-> {net_event.to_state:<9} {net_event.reason}",
            )
        )
    for _, line in sorted(merged, key=lambda item: item[0]):
        out.write(f"[{time.monotonic() - timeline.started:6.1f}s] {line}\n")
    out.flush()


@dataclass(frozen=True)
class DemoNet:
    """What the demo runs its jobs on: a net, its job definition, and how to say it."""

    name: str = NET
    definition: str = JOB_NAME
    backend: str = "NVFLARE"
    server: str = "server"


def _run_one(
    stack: LocalStack, timeline: Timeline, key: str, out: TextOut, net: DemoNet
) -> uuid.UUID:
    job_id = stack.enqueue(key, definition=net.definition, net=net.name)
    out.write(
        f"[{time.monotonic() - timeline.started:6.1f}s] enqueued {key} as job {str(job_id)[:8]}\n"
    )

    def run_over() -> bool:
        _poll(stack, timeline, out)
        job = stack.job(job_id)
        return job is not None and job.state in (
            JobState.FINISHING,
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.ABORTED,
        )

    stack.wait_for(f"job {key}'s run to finish", run_over, RUN_TIMEOUT_S, poll_s=0.5)
    job = stack.job(job_id)
    if job is not None and job.state == JobState.FINISHING:
        # FLIP's fl-server uploads the results from its own disk, then flip-api reports it:
        # the server must stay up until then (RELEASE_AFTER=reported).
        out.write(
            f"[{time.monotonic() - timeline.started:6.1f}s] {net.backend} finished; the "
            f"{net.server} is held (net {stack.net(net.name).state}) while flip-api uploads "
            "the results...\n"
        )
        time.sleep(UPLOAD_S)
        _poll(stack, timeline, out)
        out.write(
            f"[{time.monotonic() - timeline.started:6.1f}s] flip-api reports results_uploaded\n"
        )
        stack.client.report_job_status(job_id, ReportedStatus.RESULTS_UPLOADED)

    def finished() -> bool:
        _poll(stack, timeline, out)
        job = stack.job(job_id)
        return job is not None and job.state in (
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.ABORTED,
        )

    stack.wait_for(f"job {key} to finish", finished, RUN_TIMEOUT_S, poll_s=0.5)
    job = stack.job(job_id)
    assert job is not None
    if job.state != JobState.COMPLETED:
        raise RuntimeError(f"job {key} ended {job.state}: {job.last_error}")

    def stopped() -> bool:
        _poll(stack, timeline, out)
        return (
            stack.net(net.name).state == NetState.STOPPED
            and not stack.driver(net.name).observe().is_up
        )

    stack.wait_for(f"the {net.server} to scale to zero", stopped, RUN_TIMEOUT_S, poll_s=0.5)
    return job_id


def _seconds(a: datetime | None, b: datetime | None) -> str:
    return f"{(b - a).total_seconds():6.1f}s" if a and b else "     n/a"


def _summary(
    timeline: Timeline, job_ids: list[uuid.UUID], out: TextOut, server: str = "server"
) -> None:
    wall = time.monotonic() - timeline.started
    out.write("\nSummary\n")
    up_total = 0.0
    for index, job_id in enumerate(job_ids, 1):
        events = [e for e in timeline.job_events if e.job_id == job_id]
        at = {e.to_state: e.at for e in events}
        assigned = at.get(JobState.ASSIGNED)
        starting = timeline.first(timeline.net_events, NetState.STARTING, assigned)
        ready = timeline.first(timeline.net_events, NetState.READY, assigned)
        stopped = timeline.first(timeline.net_events, NetState.STOPPED, at.get(JobState.COMPLETED))
        if starting and stopped:
            up_total += (stopped - starting).total_seconds()
        out.write(
            f"  job {index}: cold start {_seconds(starting, ready)}   dispatch "
            f"{_seconds(ready, at.get(JobState.RUNNING))}   run "
            f"{_seconds(at.get(JobState.RUNNING), at.get(JobState.FINISHING))}   held "
            f"{_seconds(at.get(JobState.FINISHING), at.get(JobState.COMPLETED))}   "
            f"enqueue->done {_seconds(at.get(JobState.QUEUED), at.get(JobState.COMPLETED))}\n"
        )
    out.write(
        f"  {server} up {up_total:.1f}s of {wall:.1f}s wall time "
        f"({100 * up_total / wall:.0f}%); scaled to zero {len(job_ids)} times\n"
    )


def _callback_printer(timeline: Timeline, out: TextOut) -> Callable[[Received], None]:
    def show(received: Received) -> None:
        out.write(
            f"[{time.monotonic() - timeline.started:6.1f}s] callback  {received.describe()}\n"
        )

    return show


def _callbacks_summary(stack: LocalStack, receiver: LocalReceiver, out: TextOut) -> None:
    """Wait (a little) for the last events, then count what flip-api's stand-in heard."""
    stored = stack.read(lambda s: int(s.scalar(select(func.count()).select_from(JobEvent)) or 0))

    def distinct() -> set[int | str | None]:
        return {r.event_id for r in receiver.received if r.status == 200}

    deadline = time.monotonic() + CALLBACKS_SETTLE_S
    while len(distinct()) < stored and time.monotonic() < deadline:
        time.sleep(0.25)
    received = receiver.received
    accepted = [r for r in received if r.status == 200]
    out.write(
        f"  callbacks: {len(distinct())} events received of {stored} job moves stored, "
        f"{len(accepted)} requests, all signed: "
        f"{'yes' if accepted and all(r.valid for r in received) else 'NO'}\n"
    )


def run_demo(
    workdir: Path | None = None,
    *,
    idle_gap_s: float = 5.0,
    keep: bool = False,
    backend: str = "nvflare",
    out: TextOut = sys.stdout,
) -> int:
    """Run the demo on an NVFLARE net, or on a Flower net (`backend="flower"`); returns the
    process exit code."""
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="fl-dispatcher-demo-")) if workdir is None else workdir
    shared = SharedOut(out)
    out = shared
    out.write(f"fl-dispatcher demo in {root}\n")
    timeline = Timeline()
    succeeded = False
    secret = secrets.token_urlsafe(32)  # this run's CALLBACK_SECRET, never printed
    try:
        with (
            LocalReceiver(secret, on_event=_callback_printer(timeline, out)) as receiver,
            contextlib.ExitStack() as resources,
        ):
            extra_env = {
                "RELEASE_AFTER": "reported",
                "CALLBACK_URL": receiver.url,
                "CALLBACK_SECRET": secret,
            }
            if backend == "flower":
                options, net = _flower_options(root, extra_env, resources, out)
                intro = (
                    "a local Flower net: its SuperLink started and stopped by the worker's "
                    "local driver, 2 SuperNodes running"
                )
            else:
                options, net = StackOptions(workdir=root, extra_env=extra_env), DemoNet()
                intro = "provisioned a local NVFLARE deployment; sites started"
            with LocalStack(options) as stack:
                out.write(
                    f"{intro}; worker + beat running on SQLite; status callbacks to "
                    f"{receiver.url}\n"
                )
                first = _run_one(stack, timeline, f"demo-{uuid.uuid4().hex[:6]}-1", out, net)
                out.write(
                    f"--- idle gap of {idle_gap_s:.0f}s: the {net.server} stays at zero ---\n"
                )
                time.sleep(idle_gap_s)
                second = _run_one(stack, timeline, f"demo-{uuid.uuid4().hex[:6]}-2", out, net)
                _poll(stack, timeline, out)
                _summary(timeline, [first, second], out, net.server)
                _callbacks_summary(stack, receiver, out)
                succeeded = True
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
        out.write(f"demo failed: {exc}\n(logs kept in {root})\n")
        _next_steps(root, kept=True, out=out)
        return 1
    finally:
        if own_dir and succeeded and not keep:
            shutil.rmtree(root, ignore_errors=True)
    out.write("done: no process left behind\n")
    _next_steps(root, kept=keep or not own_dir, out=out)
    return 0


FLOWER_NET = "flower-net"
FLOWER_APP = "demo-flower-app"


def _flower_venv(out: TextOut) -> Path:
    """FLWR_VENV if the environment names one, else the checkout's own (made from
    `.ci/flower.lock` on first use, as the tests make it)."""
    from app.local import flower

    named = os.environ.get("FLWR_VENV")
    if named:
        return Path(named)
    if not flower.flower_venv_ready():
        out.write(
            f"making Flower's virtualenv from {flower.LOCK} (once; a few minutes) into "
            f"{flower.flower_venv_path()}...\n"
        )
    return flower.ensure_flower_venv()


def _flower_options(
    root: Path, extra_env: dict[str, str], resources: contextlib.ExitStack, out: TextOut
) -> tuple[StackOptions, DemoNet]:
    """A local Flower net and its two SuperNodes, registered by site name and running; the
    stack to run on it."""
    from app.local import flower

    venv = _flower_venv(out)
    entry, sites = flower.local_flower_net(root, venv, name=FLOWER_NET, idle_timeout_s=6)
    resources.callback(sites.close)
    flower.build_flower_app(root / "jobs" / FLOWER_APP, **{"num-rounds": 2})
    options = StackOptions(
        workdir=root,
        nvflare=False,
        extra_nets=[entry],
        flwr_venv=venv,
        extra_env=extra_env,
    )
    return options, DemoNet(FLOWER_NET, FLOWER_APP, "Flower", "SuperLink")


def _next_steps(root: Path, *, kept: bool, out: TextOut) -> None:
    """How to look at what the demo did, and what to run after it."""
    env_file = root / ENV_FILE
    look = f"fl-dispatcher --env-file {shell_word(env_file)}"
    if kept:
        out.write(
            f"\nLook at what it did: {root} keeps its settings ({ENV_FILE}, nets in "
            f"{NETS_FILE}), its database and logs:\n"
            f"  {look} status\n"
            f"  {look} jobs\n"
            f"  {look} api --port 8080    then http://127.0.0.1:8080/nets and /fl/status\n"
        )
    else:
        out.write(
            f"\nIts folder is deleted. To look at what it did afterwards, run "
            f"`fl-dispatcher demo --keep`, then `fl-dispatcher --env-file "
            f"<its folder>/{ENV_FILE} status` (and jobs, api: /nets, /fl/status).\n"
        )
    out.write(
        "A local net of your own, without the demo: `fl-dispatcher local-net DIR` provisions "
        'one and prints its nets entry (README "A local net of your own").\n'
    )

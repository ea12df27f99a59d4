"""One message delivered to a simulated worker, under `app.handlers`' delivery rules (the
ones tasks/base.py carries out on Celery): expiry, `on_error`'s verdict on what a handler
raised (a retry with backoff, late behind a broker backlog sometimes, with on_retry's count;
on_failure's requeue; a chain ended), a handler's `again_in` (wait_ready's and warm_up's
polls, the callback round's next due event), the chain's next link. An exception escaping a
use case is a finding (no-escape) unless the design wants it loud; a message that Celery
would acknowledge while a caller's request in it was not carried out is `request-lost`; a
worker killed mid-task has its message sent again (`ACKS.late`, `sent_again_in_s`, its
losses counted), and one whose handler ended while the broker was down comes back (its ack
never left the worker); one killed at its hard time limit is acknowledged where
`ACKS.on_timeout` says so (else sent again). An error the adversary injected where the
design lets a task fail is its to excuse (`excuse`, `refused`)."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from app import names
from app.errors import InvalidRequest, MisconfigurationError, NotFound
from app.handlers import (
    ACKS,
    HANDLERS,
    Handler,
    Kind,
    Verdict,
    backoff_s,
    on_error,
    sent_again_in_s,
    step_of,
)
from app.handlers import ends_chain as chain_ends
from app.runtime import Runtime
from app.sim import messages
from app.sim.interleaving import TimeLimitKilled, WorkerKilled
from app.sim.messages import Message
from app.sim.view import SimView
from app.usecases import dispatch as dispatch_uc
from app.usecases.dispatch import Step
from models import NetState

PIPELINE_STEPS_THAT_MARK_MISCONFIGURED = (names.SCALE_UP, names.WAIT_READY, names.DISPATCH)


class Delivery:
    """The message layer's side of a simulation: the worker runs what it is given."""

    def __init__(self, sim: SimView) -> None:
        self.sim = sim
        self._net_events_at_start: dict[int, int] = {}  # a pipeline step's message -> id
        self.began: dict[int, float] = {}  # each message being processed -> when it began
        self.calls: list[int] = []  # the messages whose handler is running, outermost first
        # The enqueues answered, by Celery task id (every copy of one message): "rejected" or
        # "job" per answer, for the harness's one message, one answer (tests.sim).
        self.answers: dict[int, list[str]] = {}

    def deliver(self, message: Message, slot: int) -> None:
        """One delivery of a message to the worker in `slot`, with tasks/base.py's rules."""
        sim = self.sim
        spec = HANDLERS[message.task]
        # Celery judges expiry by the worker's own clock.
        if message.expires_at is not None and sim.process_clocks[slot].t > message.expires_at:
            if sim.tracing:
                sim.trace(f"   expired {message.label()}")
            return
        if sim.fast_forward and message.task == names.ASSIGN_NEXT_JOB and not sim.calm().assign_due:
            # No QUEUED job has a free net to go to: assign would read and do nothing.
            sim.stats["skipped"] = sim.stats.get("skipped", 0) + 1
            return
        sim.stats["messages"] += 1
        rt = sim.workers[slot]
        sim.running.append(slot)
        sim.current.append(message)
        self.began[message.id] = sim.clock.t
        if spec.kind is Kind.PIPELINE:
            row = sim.conn.execute("SELECT max(id) FROM net_events").fetchone()
            self._net_events_at_start[message.id] = row[0] or 0
        finished = False
        try:
            self._run_task(rt, message, spec, slot)
            finished = True
            back = sim.broker.down_until(sim.clock.t) if sim.broker.outages else None
            if back is not None and ACKS.late:
                sim.broker.restore_unacked(message, back)
        except WorkerKilled as killed:
            delay = sim.rng.uniform(1.0, max(1.0, sim.faults.worker_restart_s))
            if isinstance(killed, TimeLimitKilled) and ACKS.on_timeout(spec.kind):
                # Killed at the hard time limit and acknowledged (acks_on_timeout): gone.
                if spec.kind is Kind.REQUEST:
                    self._forgotten(message, spec, "it was killed at its hard time limit")
            elif ACKS.late and self._channel_closed(message):
                # The worker's broker connection dropped while it ran (an outage then, or
                # now): its channel closed and the broker took the message back, so no copy
                # is sent (`SentAgainRequest`): it comes back as it was, no loss counted.
                sim.broker.redeliver(message, delay)
            elif ACKS.late:
                # Sent again by the worker's main process, its losses counted: at once the
                # first time (taken once a worker is back), then after the retries' backoff.
                wait = sent_again_in_s(message.losses, sim.settings.retry_backoff_max_s, sim.rng)
                sim.broker.redeliver(replace(message, losses=message.losses + 1), max(delay, wait))
            elif spec.kind is Kind.REQUEST:  # acknowledged when taken: it died with the worker
                self._forgotten(message, spec, "its worker was killed")
            sim.dead.discard(slot)
            sim.restart_worker(slot, f"after a kill during {message.label()}")
        finally:
            sim.after_message(message, finished)
            sim.running.pop()
            sim.current.pop()
            self.began.pop(message.id, None)

    def _channel_closed(self, message: Message) -> bool:
        """Whether a broker outage overlapped the message's run (its worker's channel closed)."""
        began = self.began.get(message.id, self.sim.clock.t)
        now = self.sim.clock.t
        return any(start <= now and end > began for start, end in self.sim.broker.outages)

    def _run_task(self, rt: Runtime, message: Message, spec: Handler, slot: int) -> None:
        try:
            result = self._call(rt, message, spec)
        except Exception as exc:
            self._raised(rt, message, spec, slot, exc)
            return
        if self.sim.tracing:
            self.sim.trace(f"w{slot} {message.label()} -> {_short_result(result)}")
        if message.task == names.ENQUEUE_JOB and isinstance(result, dict):
            answer = "rejected" if "rejected" in result else "job"
            self.answers.setdefault(message.task_id, []).append(answer)
        countdown = spec.again_in(self.sim.settings, result)
        if countdown is not None:
            if spec.kind is not Kind.CALLBACKS:
                countdown = self.sim.poll_delay(message.kwargs)  # the fast clock's polls
            self._push_again(message, countdown)
            return
        if message.task == names.WAIT_READY and step_of(result) == Step.DONE:
            self._note_ready(message.kwargs)
        if message.chain and not chain_ends(result):
            (task, kwargs), rest = message.chain[0], message.chain[1:]
            self.sim.broker.push(task, kwargs, chain=rest, origin=message.origin)

    def _call(self, rt: Runtime, message: Message, spec: Handler) -> object:
        """The handler itself, the part of a task its time limits bound (`in_handler`)."""
        self.calls.append(message.id)
        try:
            with self._noting_inline_readiness(message):
                kwargs = spec.kwargs(message.kwargs, message.message_id(), message.args)
                return spec.call(rt, **kwargs)
        finally:
            self.calls.pop()

    def in_handler(self) -> bool:
        """A statement now is the running message's handler's: not a worker's start (its
        ready kick, after a kill), nor the world's events while the worker stalls."""
        sim = self.sim
        return (
            bool(self.calls and sim.current)
            and self.calls[-1] == sim.current[-1].id
            and sim.running[-1] != sim.stalled
        )

    def _raised(
        self, rt: Runtime, message: Message, spec: Handler, slot: int, exc: Exception
    ) -> None:
        """`on_error`'s verdict on what the handler raised, carried out as Celery would."""
        verdict = on_error(spec, exc, message.error_retries, self.sim.settings)
        if verdict is Verdict.ENDED:
            self._escaped(message, spec, exc)  # excused once the net reads MISCONFIGURED
            return
        if verdict is Verdict.EXHAUSTED:
            self.sim.trace(f"w{slot} {message.label()} -> retries exhausted: {exc}")
            self._call_hook(
                message,
                spec,
                lambda: messages.on_failure(rt, message.task, message.kwargs, exc),
            )
            return
        if verdict is Verdict.FAILED:
            self._escaped(message, spec, exc)
            if spec.kind is Kind.REQUEST and not self.sim.refused(spec.kind, exc):
                # Acknowledged on failure (or rejected without requeue): gone.
                self._forgotten(message, spec, f"it raised {type(exc).__name__}")
            return
        self.sim.stats["retries"] += 1
        late = 0.0
        backlog = self.sim.faults.retry_backlog
        if spec.kind is Kind.PIPELINE and backlog and self.sim.rng_msg.random() < backlog:
            # A backlog on the broker: the retry runs well after its countdown, past the
            # lease its try announced, so reconcile may re-send the same submit meanwhile.
            late = self.sim.rng_msg.uniform(30.0, 90.0)
            self.sim.trace(f"w{slot} {message.label()} -> its retry {late:.0f}s late (backlog)")
        countdown = backoff_s(
            message.error_retries, self.sim.settings.retry_backoff_max_s, self.sim.rng_msg
        )
        if spec.kind is Kind.PIPELINE:
            self._call_hook(message, spec, lambda: messages.on_retry(rt, message.kwargs, countdown))
        if self.sim.tracing:
            self.sim.trace(f"w{slot} {message.label()} -> retry in {countdown:.0f}s: {exc}")
        sent = self._push_again(message, countdown + late, error_retries=message.error_retries + 1)
        if (
            not sent
            and spec.kind is Kind.REQUEST
            and self.sim.broker.down_until(self.sim.clock.t) is None
        ):
            # Celery's retry answers a copy the broker refuses with Reject(requeue=False),
            # which tasks/base.py makes Reject(requeue=True) for a caller's request: back as
            # it was. (With the broker down now, its channel closed: `deliver` restores it.)
            self.sim.trace(f"w{slot} {message.label()} -> its retry refused: put back")
            self.sim.broker.redeliver(message, 0.0)

    def _forgotten(self, message: Message, spec: Handler, why: str) -> None:
        """A caller's request the broker no longer holds although it was not carried out."""
        self.sim.report(
            "request-lost",
            message.label(),
            f"flip-api's {spec.name.removeprefix(names.PREFIX)} was acknowledged: {why}",
        )

    def _push_again(
        self, message: Message, countdown: float, *, error_retries: int | None = None
    ) -> bool:
        """Celery's retry: the same task id and headers (its losses; its error retries, one
        more after an error, as they were after a poll), `retries` one more either way;
        False if the broker refused the copy."""
        return self.sim.broker.push(
            message.task,
            message.kwargs,
            delay=countdown,
            chain=message.chain,
            retries=message.retries + 1,
            origin=message.origin,
            task_id=message.task_id,  # Celery's retry keeps the task id, and its headers
            losses=message.losses,
            error_retries=message.error_retries if error_retries is None else error_retries,
            faulty=message.faulty,
            args=message.args,
            named_id=message.named_id,
        )

    def _call_hook(self, message: Message, spec: Handler, call: Callable[..., None]) -> None:
        """on_retry/on_failure: use-case calls too, so their errors are findings too."""
        try:
            call()
        except Exception as exc:
            self._escaped(message, spec, exc)

    @contextlib.contextmanager
    def _noting_inline_readiness(self, message: Message) -> Iterator[None]:
        """scale_up runs readiness and the submit itself on a warm net (dispatch.start): a
        readiness check that passes inside it counts for `on_submit` as wait_ready's does.
        Noted by the check's own (job, net), so a message interleaved meanwhile is noted
        for itself, never for this one."""
        if message.task != names.SCALE_UP:
            yield
            return
        original = dispatch_uc.check_ready

        def noting(rt: Runtime, job_id: Any, net_name: str, attempt: int, **kw: Any) -> Any:
            result = original(rt, job_id, net_name, attempt, **kw)
            if result.step == Step.DONE:
                self._note_ready({"job_id": str(job_id), "net_name": net_name})
            return result

        dispatch_uc.check_ready = noting
        try:
            yield
        finally:
            dispatch_uc.check_ready = original

    def _note_ready(self, kwargs: dict[str, Any]) -> None:
        row = self.sim.conn.execute(
            "SELECT assigned_at FROM jobs WHERE id = ?", (kwargs["job_id"].replace("-", ""),)
        ).fetchone()
        if row is not None:
            self.sim.ready_seen[(kwargs["job_id"], kwargs["net_name"])] = row[0]

    def _escaped(self, message: Message, spec: Handler, exc: Exception) -> None:
        """An exception left a use case: a finding, unless the design wants it loud."""
        if spec.kind is Kind.REQUEST and isinstance(exc, (InvalidRequest, NotFound)):
            self.sim.trace(f"   {message.label()} rejected: {exc}")
            return
        if (
            isinstance(exc, MisconfigurationError)
            and message.task in PIPELINE_STEPS_THAT_MARK_MISCONFIGURED
            and self._marked_misconfigured(message)
        ):
            self.sim.trace(f"   {message.label()} failed loud (net misconfigured): {exc}")
            return
        why = self.sim.excuse(spec.kind, exc)
        if why is not None:
            self.sim.trace(f"   {message.label()} failed on {why}: {type(exc).__name__}")
            return
        self.sim.stats["escapes"] += 1
        where = _app_frame(exc)
        self.sim.report(
            "no-escape",
            f"{message.task.removeprefix(names.PREFIX)}: {type(exc).__name__} at {where}",
            f"{exc}"[:300],
        )

    def _marked_misconfigured(self, message: Message) -> bool:
        """The step's net is MISCONFIGURED, or was marked so while the step ran (a step
        paused after marking it may resume after reconcile or a human moved it on)."""
        net = message.kwargs.get("net_name")
        if self._net_state(net) == NetState.MISCONFIGURED:
            return True
        since = self._net_events_at_start.get(message.id, 0)
        row = self.sim.conn.execute(
            "SELECT 1 FROM net_events WHERE net_name = ? AND to_state = 'MISCONFIGURED'"
            " AND id > ? LIMIT 1",
            (net, since),
        ).fetchone()
        return row is not None

    def _net_state(self, net: str | None) -> NetState | None:
        if net is None:
            return None
        row = self.sim.conn.execute("SELECT state FROM nets WHERE name = ?", (net,)).fetchone()
        return None if row is None else NetState(row[0])


def _short_result(result: object) -> str:
    step, detail = getattr(result, "step", None), getattr(result, "detail", "")
    if step is not None:
        result = f"{step}: {detail}" if detail else str(step)
    text = repr(result) if not isinstance(result, str) else result
    return text if len(text) < 160 else text[:157] + "..."


def _app_frame(exc: BaseException) -> str:
    """The innermost frame of the code under test (app/, models/) in the traceback."""
    where = "?"
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = Path(frame.filename).parts
        if "app" in parts or "models" in parts:
            if "tests" in parts:
                continue
            idx = max(i for i, p in enumerate(parts) if p in ("app", "models"))
            where = f"{'/'.join(parts[idx:])}:{frame.name}:{frame.lineno}"
    return where

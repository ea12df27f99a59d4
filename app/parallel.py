"""Run calls in parallel and wait at most a deadline for all of them.

Used wherever one slow or hung outside system must not slow the others: the status view
probes every net's driver and admin server at once, and readiness checks the database and
the broker at once.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from app.errors import MisconfigurationError
from app.redact import redact_text


@dataclass(frozen=True)
class ProbeResult:
    """A probe's value, or the error string that replaces it."""

    value: Any = None
    error: str | None = None


def describe_error(exc: BaseException) -> str:
    """A one-line error for an operator; a misconfiguration says so first."""
    # redact_text: an endpoint in an adapter's message may carry credentials.
    if isinstance(exc, MisconfigurationError):
        return redact_text(f"misconfigured: {exc}")
    return redact_text(f"{type(exc).__name__}: {exc}")


class Sequential:
    """Runs the calls one after another in this thread, with no deadline: deterministic, for
    the unit tier and the simulator. Same results as `Prober.run`."""

    def run(
        self, calls: Mapping[str, Callable[[], Any]], timeout_s: float
    ) -> dict[str, ProbeResult]:
        """Run every call in order; an exception becomes the result's error."""
        results: dict[str, ProbeResult] = {}
        for key, call in calls.items():
            try:
                results[key] = ProbeResult(value=call())
            except Exception as exc:  # noqa: BLE001 - reported like Prober reports it
                results[key] = ProbeResult(error=describe_error(exc))
        return results


class Prober:
    """Runs probes in parallel, waiting at most a deadline for all of them.

    Each probe runs on its own daemon thread rather than a ThreadPoolExecutor: an
    executor's workers are joined at interpreter exit, so one admin login hung on a
    black-holed address would keep `fl-dispatcher status` or a stopping API from exiting.
    A probe that overruns keeps its thread (Python cannot kill one); while it is still
    running the same key is not probed again, so a hung server holds at most one thread per
    key, not one per request. Probes never queue behind each other, so the response time
    does not grow with the number of unreachable nets.
    """

    def __init__(self, max_parallel: int | None = None) -> None:
        self._inflight: dict[str, Future[Any]] = {}
        self._lock = threading.Lock()
        # At most this many calls run at once (a fleet of a thousand nets must not start a
        # thousand admin sessions); a call still waiting for a slot at its deadline is dropped.
        self._slots = threading.BoundedSemaphore(max_parallel) if max_parallel else None

    def _start(self, key: str, call: Callable[[], Any], deadline: float) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        slots = self._slots

        def target() -> None:
            if slots is not None and not slots.acquire(
                timeout=max(0.0, deadline - time.monotonic())
            ):
                future.set_exception(TimeoutError("no free slot before the deadline"))
                return
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - what an executor does: the waiter reports it
                future.set_exception(exc)
            finally:
                if slots is not None:
                    slots.release()

        # The caller's context variables go with the call (a round's trace span, app/traces.py).
        context = contextvars.copy_context()
        threading.Thread(
            target=context.run, args=(target,), name=f"probe {key}", daemon=True
        ).start()
        return future

    def run(
        self, calls: Mapping[str, Callable[[], Any]], timeout_s: float
    ) -> dict[str, ProbeResult]:
        """Start every call, wait until all are done or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        results: dict[str, ProbeResult] = {}
        started: dict[str, Future[Any]] = {}
        with self._lock:
            for key, call in calls.items():
                previous = self._inflight.get(key)
                if previous is not None and not previous.done():
                    results[key] = ProbeResult(
                        error="probe timed out (previous probe still running)"
                    )
                    continue
                started[key] = self._inflight[key] = self._start(key, call, deadline)
        wait_futures(started.values(), timeout=max(0.0, deadline - time.monotonic()))
        for key, future in started.items():
            if not future.done():
                results[key] = ProbeResult(error="probe timed out")
            elif (exc := future.exception()) is not None:
                results[key] = ProbeResult(error=describe_error(exc))
            else:
                results[key] = ProbeResult(value=future.result())
        return results

    def hung(self) -> list[str]:
        """Keys whose last probe is still running."""
        with self._lock:
            return sorted(k for k, f in self._inflight.items() if not f.done())

"""OpenTelemetry traces of each job (TRACES=true, the `traces` extra): one trace per job, from
its enqueue through the claim, the scale-up, each readiness poll, the submit, the monitor's
verdict and each status callback (app/entrypoints/README.md "Traces").

The enqueue span is a child of the caller's W3C `traceparent` (the HTTP header, or the
Celery task's headers, which Celery's instrumentation reads) and its own traceparent is
stored on the job row. Every later span of the job is a child of that stored context,
whichever message or beat round makes it: a round acts on many jobs, so it cannot be any
one's parent; the span links to the round's (or message's) own span instead.

Off (the default) nothing of OpenTelemetry is imported, and every call here returns at once
after one global read, without a statement more: the column is read with the rows the use
cases read anyway, and only a pipeline step reads it alone (once per job and process).
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import select

from app import names
from app.errors import SettingsError
from models import Job

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.trace import Link, Span, Tracer

    from app.runtime import Runtime
    from app.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])

SERVICE = "fl-dispatcher"  # service.name unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say
SPAN_PREFIX = "fl_dispatcher."
JOB_ID = "fl_dispatcher.job_id"
NET = "fl_dispatcher.net"
ATTEMPT = "fl_dispatcher.attempt"
# The Celery spans of a round run every second (AWAITED_POLL_S) that acts on no job as a rule:
# not exported when they are a trace's root (the job spans they make still are).
QUIET_ROOTS = frozenset({f"run/{names.MONITOR_AWAITED_RUNS}"})
# Job ids whose traceparent a pipeline step has read, per process (it never changes).
_CACHE_SIZE = 4096


class _State:
    tracer: Tracer | None = None
    provider: TracerProvider | None = None
    stored: dict[uuid.UUID, str | None] = {}


def enabled() -> bool:
    """Traces are on in this process (`setup` ran with TRACES=true)."""
    return _State.tracer is not None


def setup(settings: Settings, *, instrument_celery: bool = True, exporter: Any = None) -> bool:
    """Turn traces on for this process when TRACES says so (after a fork: a worker's pool
    process, the status API, the CLI): the SDK's tracer provider with the OTLP exporter,
    configured by the standard OTEL_* variables (or TRACES_FILE's JSON lines; `exporter`,
    a SpanExporter, in tests), and Celery's instrumentation. True when on. Without the
    extra: a SettingsError naming it."""
    if not settings.traces:
        return False
    if _State.tracer is not None:
        return True
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        raise SettingsError(
            "TRACES=true needs the traces extra: pip install 'fl-dispatcher[traces]'"
        ) from None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(_export_processor(settings.traces_file, exporter))
    trace.set_tracer_provider(provider)
    if instrument_celery:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    _State.provider = provider
    _State.tracer = provider.get_tracer("fl_dispatcher")
    return True


def flush() -> None:
    """Export what is pending (a worker's pool process about to exit)."""
    if _State.provider is not None:
        _State.provider.force_flush()


def reset() -> None:
    """Traces off again in this process (tests)."""
    if _State.provider is not None:
        _State.provider.shutdown()
    _State.tracer = _State.provider = None
    _State.stored.clear()


def _export_processor(path: Path | None, exporter: Any = None) -> SpanProcessor:
    """OTLP over HTTP in batches (OTEL_EXPORTER_OTLP_*, OTEL_BSP_*), or each span as one JSON
    line appended to `path` as it ends; either way without the quiet rounds' root spans."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class JsonLines(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            assert path is not None
            for span in spans:
                line = json.dumps(json.loads(span.to_json(indent=None))) + "\n"
                # One write per span on an O_APPEND file: pool processes never interleave.
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
            return SpanExportResult.SUCCESS

    if exporter is not None or path is not None:
        inner: SpanProcessor = SimpleSpanProcessor(exporter or JsonLines())
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        inner = BatchSpanProcessor(OTLPSpanExporter())

    class WithoutQuietRoots(SpanProcessor):
        def on_start(self, span: Any, parent_context: Context | None = None) -> None:
            inner.on_start(span, parent_context)

        def on_end(self, span: ReadableSpan) -> None:
            if span.parent is None and span.name in QUIET_ROOTS:
                return
            inner.on_end(span)

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(inner.force_flush(timeout_millis))

    return WithoutQuietRoots()


def clock() -> int:
    """Now in ns for a span recorded after the fact (0, unread, while traces are off)."""
    return time.time_ns() if _State.tracer is not None else 0


def _parent(traceparent: str) -> Context:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def _links(parent: Context) -> list[Link] | None:
    """A link to the span this code runs in (a Celery task's, a beat round's) when it is of
    another trace than the job's."""
    from opentelemetry import trace

    here = trace.get_current_span().get_span_context()
    job = trace.get_current_span(parent).get_span_context()
    if here.is_valid and here.trace_flags.sampled and here.trace_id != job.trace_id:
        return [trace.Link(here)]
    return None


def _traceparent(span: Span) -> str | None:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent")


def _job_attributes(job_id: object, net: str | None, attempt: int | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {JOB_ID: str(job_id)}
    if net is not None:
        attributes[NET] = net
    if attempt is not None:
        attributes[ATTEMPT] = attempt
    return attributes


@contextmanager
def _job_span(
    name: str,
    traceparent: str | None,
    attributes: dict[str, Any],
    start_time: int | None = None,
) -> Iterator[Span | None]:
    """A span of the job (current while the block runs), child of its stored context; None,
    nothing recorded, while traces are off or for a job enqueued without a trace."""
    tracer = _State.tracer
    if tracer is None or not traceparent:
        yield None
        return
    parent = _parent(traceparent)
    with tracer.start_as_current_span(
        SPAN_PREFIX + name,
        context=parent,
        links=_links(parent),
        attributes=attributes,
        start_time=start_time,
    ) as span:
        yield span


@dataclass
class Enqueue:
    """What `enqueue` yields: the traceparent to store on a new job (None: no trace)."""

    traceparent: str | None = None
    span: Span | None = None

    def done(self, job_id: uuid.UUID, created: bool, state: object) -> None:
        """Name the job the enqueue made (or found: a repeat keeps the first trace)."""
        if self.span is not None:
            self.span.set_attributes({JOB_ID: str(job_id), "fl_dispatcher.created": created})
            self.span.set_attribute("fl_dispatcher.state", str(state))


@contextmanager
def enqueue(traceparent: str | None = None) -> Iterator[Enqueue]:
    """The enqueue's span: a child of `traceparent` (HTTP's header) or of the current context
    (the Celery task's, which the instrumentation continued from its headers), else a new
    trace's root. Its traceparent is the one the job stores."""
    tracer = _State.tracer
    if tracer is None:
        yield Enqueue()
        return
    parent = _parent(traceparent) if traceparent else None
    with tracer.start_as_current_span(SPAN_PREFIX + "enqueue", context=parent) as span:
        yield Enqueue(_traceparent(span), span)


def stored_traceparent(rt: Runtime, job_id: uuid.UUID) -> str | None:
    """The job's stored traceparent (a read the first time a process asks about the job)."""
    if job_id in _State.stored:
        return _State.stored[job_id]
    with rt.sessions() as session:
        found = session.scalar(select(Job.traceparent).where(Job.id == job_id))
    if len(_State.stored) >= _CACHE_SIZE:
        _State.stored.clear()
    _State.stored[job_id] = found
    return found


def job_step(name: str) -> Callable[[F], F]:
    """A pipeline step (rt, job_id, net_name, attempt) as a span of its job, with the step's
    outcome (`fl_dispatcher.step`, `fl_dispatcher.detail`); the step alone while off."""

    def wrap(step: F) -> F:
        @functools.wraps(step)
        def traced(rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int, **kw: Any) -> Any:
            if _State.tracer is None:
                return step(rt, job_id, net_name, attempt, **kw)
            attributes = _job_attributes(job_id, net_name, attempt)
            with _job_span(name, stored_traceparent(rt, job_id), attributes) as span:
                result = step(rt, job_id, net_name, attempt, **kw)
                if span is not None:
                    span.set_attribute("fl_dispatcher.step", str(getattr(result, "step", result)))
                    span.set_attribute("fl_dispatcher.detail", str(getattr(result, "detail", "")))
                return result

        return traced  # type: ignore[return-value]

    return wrap


@contextmanager
def claimed(assignment: Any, started: int) -> Iterator[None]:
    """The claim of `assignment` (a claims.Assignment) as a span of its job from `started`
    (`clock()` before the claim's transaction), current while its chain is sent, so the
    chain's messages carry the job's trace and not the round's."""
    attributes = _job_attributes(assignment.job_id, assignment.net_name, assignment.attempt)
    with _job_span("claim", assignment.traceparent, attributes, start_time=started or None):
        yield


def monitor_verdict(quiet: tuple[str, ...]) -> Callable[[F], F]:
    """Monitor's watch of one run (rt, admin, job: monitor.Watched, ...) -> its outcome, as a
    span of the job when the outcome moved it (one not starting with any of `quiet`: a run
    still going is watched every few seconds, and makes no span)."""

    def wrap(watch: F) -> F:
        @functools.wraps(watch)
        def traced(rt: Runtime, admin: Any, job: Any, *args: Any, **kw: Any) -> Any:
            started = clock()
            outcome = watch(rt, admin, job, *args, **kw)
            if started and not str(outcome).startswith(quiet):
                attributes = _job_attributes(job.job_id, job.net_name, None)
                attributes["fl_dispatcher.verdict"] = str(outcome)
                attributes["fl_dispatcher.nvflare_job_id"] = job.nvflare_job_id
                with _job_span("monitor_verdict", job.traceparent, attributes, started):
                    pass
            return outcome

        return traced  # type: ignore[return-value]

    return wrap


def callback(job: Any, event: Any, started: int, verdict: object) -> None:
    """One try of a status callback (job: callbacks.due.JobRef, event: its JobEvent row) as a
    span of the job from `started` (`clock()` before the POST)."""
    if not started:
        return
    attributes = _job_attributes(job.id, None, event.attempt)
    attributes |= {
        "fl_dispatcher.event_id": event.id,
        "fl_dispatcher.to_state": str(event.to_state),
        "fl_dispatcher.delivery": str(verdict),
    }
    with _job_span("callback", job.traceparent, attributes, started):
        pass

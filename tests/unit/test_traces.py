"""Traces (issue 40, app/traces.py): the caller's W3C traceparent in (a task's headers, HTTP's
header, the client's current span), stored on the job at enqueue, and continued by every
later span of the job, whatever message or round makes it; and with TRACES off, nothing of
OpenTelemetry imported. The spans of one job through a real worker: tests/e2e/test_traces.py."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app import traces
from app.client import DispatcherClient, trace_headers
from app.entrypoints.api import create_app
from app.schemas import EnqueueJob
from app.usecases import dispatch, intake, requests
from tests.fixtures.db import net_decl
from tests.unit.callback_world import LIFE, cb, complete, deliver, receiver
from tests.unit.conftest import World

__all__ = ["cb", "receiver"]  # the fixtures, used by name

ROOT = Path(__file__).resolve().parents[2]
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
JOB_STEPS = ["claim", "scale_up", "readiness_poll", "submit", "monitor_verdict"]


@pytest.fixture
def spans(cb: World) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    on = cb.rt.settings.model_copy(update={"traces": True})
    assert traces.setup(on, instrument_celery=False, exporter=exporter)
    yield exporter
    traces.reset()


def request(key: str = "j1") -> EnqueueJob:
    return EnqueueJob(caller_key=key, definition="tiny-job", net="net-a")


def named(exporter: InMemorySpanExporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == f"fl_dispatcher.{name}"]


def test_a_jobs_spans_continue_the_callers_traceparent_from_enqueue_to_its_last_callback(
    cb, receiver, spans
):
    job_id = intake.submit_job(cb.rt, request(), traceparent=CALLER).enqueued.job_id
    (enqueued,) = named(spans, "enqueue")
    assert format(enqueued.context.trace_id, "032x") == CALLER_TRACE
    assert format(enqueued.parent.span_id, "016x") == CALLER_SPAN
    stored = cb.job(job_id).traceparent
    assert stored == f"00-{CALLER_TRACE}-{enqueued.context.span_id:016x}-01"

    complete(cb, job_id)
    assert deliver(cb, receiver).delivered == len(LIFE)

    for name in [*JOB_STEPS, "callback"]:
        made = named(spans, name)
        assert made, f"no {name} span"
        for span in made:
            assert span.context.trace_id == enqueued.context.trace_id, name
            assert span.parent.span_id == enqueued.context.span_id, name
            assert span.attributes["fl_dispatcher.job_id"] == str(job_id), name
    for name in ["claim", "scale_up", "readiness_poll", "submit"]:
        (span,) = named(spans, name)
        assert span.attributes["fl_dispatcher.net"] == "net-a", name
        assert span.attributes["fl_dispatcher.attempt"] == 0, name
    (verdict,) = named(spans, "monitor_verdict")
    assert verdict.attributes["fl_dispatcher.verdict"] == "completed"
    sent = [s.attributes["fl_dispatcher.to_state"] for s in named(spans, "callback")]
    assert sent == LIFE


def test_a_step_run_in_another_trace_stays_in_the_jobs_and_links_to_that_span(cb, spans):
    """A beat round (or a kick sent for another job) acts on this job: its span is the job's
    child, with a link to the round's span, never the round's child."""
    job_id = intake.submit_job(cb.rt, request(), traceparent=CALLER).enqueued.job_id
    round_tracer = TracerProvider().get_tracer("a beat round")
    with round_tracer.start_as_current_span("run/fl_dispatcher.assign_next_job") as round_span:
        (assignment,) = dispatch.claim_and_start(cb.rt)
    assert assignment.job_id == job_id
    (claim,) = named(spans, "claim")
    assert format(claim.context.trace_id, "032x") == CALLER_TRACE
    assert [link.context.span_id for link in claim.links] == [round_span.get_span_context().span_id]


def test_a_repeated_enqueue_keeps_the_first_trace(cb, spans):
    job_id = intake.submit_job(cb.rt, request(), traceparent=CALLER).enqueued.job_id
    first = cb.job(job_id).traceparent
    other = f"00-{'1' * 32}-{'2' * 16}-01"
    intake.submit_job(cb.rt, request(), traceparent=other)
    assert cb.job(job_id).traceparent == first


def test_the_task_continues_the_context_celery_attached_from_its_headers(cb, spans):
    """What the Celery instrumentation leaves current for a task whose headers carried a
    traceparent: the enqueue span is its child."""
    context = TraceContextTextMapPropagator().extract({"traceparent": CALLER})
    tracer = TracerProvider().get_tracer("celery")
    with tracer.start_as_current_span("run/fl_dispatcher.enqueue_job", context=context) as run:
        answer = requests.enqueue_job(cb.rt, request().model_dump(mode="json"))
    (enqueued,) = named(spans, "enqueue")
    assert enqueued.parent.span_id == run.get_span_context().span_id
    stored = cb.job(uuid.UUID(answer["job_id"])).traceparent
    assert stored is not None and stored.split("-")[1] == CALLER_TRACE


def test_the_http_door_continues_the_callers_traceparent_header(tmp_path, cb, spans):
    body = request().model_dump(mode="json")
    secret = "traces-api-key-0123456789"
    rt = cb.rt
    rt.settings = rt.settings.model_copy(
        update={"api_secret": type(rt.settings.api_secret)(secret)}
    )
    with TestClient(create_app(rt)) as client:
        answer = client.post(
            "/jobs", json=body, headers={"X-API-Key": secret, "traceparent": CALLER}
        )
    assert answer.status_code == 201, answer.text
    (enqueued,) = named(spans, "enqueue")
    assert format(enqueued.parent.span_id, "016x") == CALLER_SPAN
    assert cb.job(uuid.UUID(answer.json()["job_id"])).traceparent.split("-")[1] == CALLER_TRACE


class _Sent:
    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.conf = self

    def update(self, **_: object) -> None:
        pass

    def send_task(self, name: str, **kwargs: object) -> None:
        self.calls.append(kwargs)


def test_the_client_sends_the_callers_current_context_in_the_tasks_headers():
    app = _Sent()
    client = DispatcherClient("memory://", app=app)  # type: ignore[arg-type]
    client.enqueue_job(request())
    assert app.calls[-1]["headers"] is None  # no current span: no header
    tracer = TracerProvider().get_tracer("flip-api")
    with tracer.start_as_current_span("flip-api request") as span:
        client.enqueue_job(request())
        assert trace_headers() == app.calls[-1]["headers"]
    sent = app.calls[-1]["headers"]["traceparent"].split("-")
    context = span.get_span_context()
    assert sent[1:3] == [f"{context.trace_id:032x}", f"{context.span_id:016x}"]


OFF_OR_ON = """
from app import traces
from app.celery_app import _on_worker_process_init, configure
from app.migrate import upgrade
from app.runtime import Runtime
from app.schemas import EnqueueJob
from app.settings import load_settings
from app.usecases import callbacks, declared_nets, dispatch, intake, monitor, records
import app.entrypoints.api, app.entrypoints.cli, app.client, tasks.registered
from models import utcnow

settings = load_settings()
configure(settings)
_on_worker_process_init()
upgrade(settings.database_url)
rt = Runtime.from_settings(settings)
with rt.sessions.begin() as session:
    declared_nets.sync_nets(session, settings, utcnow())
intake.submit_job(rt, EnqueueJob(caller_key="j1", definition="tiny-job", net="net-a"))
dispatch.claim_and_start(rt)
monitor.monitor_running_jobs(rt)
"""


# Libraries that load OpenTelemetry's API (and redis-py its metrics SDK) at their own import
# whenever it is installed: what a process loads with them is the baseline.
LIBRARIES = ("celery", "fastapi", "httpx", "kombu", "redis", "sqlalchemy", "uvicorn")
LOADED = 'print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))'


def _loaded(code: str, env: dict[str, str], cwd: Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"import json, sys\n{code}\n{LOADED}"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
def test_with_traces_off_nothing_of_opentelemetry_is_imported(tmp_path, job_root, on):
    """A worker's pool process (its start, a task module, the API and CLI loaded) enqueues,
    claims and monitors: off, it loads no OpenTelemetry module beyond those its libraries
    load at their own import when installed (redis-py, FastAPI: the baseline); on, the
    tracing SDK and the instrumentation (the check can fail)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "FL_DISPATCHER_DATA_DIR": str(tmp_path / "data"),
        "BROKER_URL": "memory://",
        "JOB_ROOT": str(job_root),
        "NETS": json.dumps([net_decl(tmp_path, "net-a", "static")]),
        "TRACES": "true" if on else "false",
        "TRACES_FILE": str(tmp_path / "spans.jsonl"),
    }
    libraries_own = _loaded(f"import {', '.join(LIBRARIES)}", env, tmp_path)
    added = _loaded(OFF_OR_ON, env, tmp_path) - libraries_own
    if on:
        assert {"opentelemetry.sdk.trace", "opentelemetry.instrumentation.celery"} <= added
        assert (tmp_path / "spans.jsonl").read_text().count('"fl_dispatcher.enqueue"') == 1
    else:
        assert added == set()


def test_without_the_extra_traces_on_stops_the_start(cb, monkeypatch):
    from app.errors import SettingsError

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(SettingsError, match=r"fl-dispatcher\[traces\]"):
        traces.setup(cb.rt.settings.model_copy(update={"traces": True}))
    assert not traces.enabled()


def test_the_current_span_of_a_job_trace_is_not_linked_to_itself(cb, spans):
    with trace.get_tracer("t").start_as_current_span("x"):
        pass
    job_id = intake.submit_job(cb.rt, request(), traceparent=CALLER).enqueued.job_id
    parent = TraceContextTextMapPropagator().extract({"traceparent": cb.job(job_id).traceparent})
    with TracerProvider().get_tracer("t").start_as_current_span("same trace", context=parent):
        dispatch.claim_and_start(cb.rt)
    (claim,) = named(spans, "claim")
    assert list(claim.links) == []

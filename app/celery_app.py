"""The Celery app: its configuration is derived from Settings, never written by hand.

JSON only, explicit dotted task names, late acks with requeue on a lost worker, prefetch 1,
no result backend (the SQL tables are the job store), three queues (`app.names`), and one
beat schedule, sent to the housekeeping queue.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery import Celery, chain, signals
from kombu import serialization
from kombu.entity import Exchange, Queue
from kombu.utils import json as kombu_json

from app import names
from app.broker_pruning import PruneConsumedMessages
from app.payload_json import loads_payload
from app.process_guard import refuse_same_user_inspection
from app.publishing import published
from app.redis_transport import TRANSPORT_PATH
from app.settings import Settings, load_settings
from app.worker_pool import POOL_PATH

if TYPE_CHECKING:
    from app.runtime import Runtime

PIPELINE_SOFT_LIMIT_S = 300
PIPELINE_HARD_LIMIT_S = 360
HOUSEKEEPING_SOFT_LIMIT_S = 600
HOUSEKEEPING_HARD_LIMIT_S = 660
# Longer than any countdown or ETA we use, so Redis never redelivers a task that is only
# waiting for its retry time (kombu's default is 1 h; ours stays well above the caps).
VISIBILITY_TIMEOUT_S = 2 * 3600

log = logging.getLogger(__name__)

# At import: Celery imports the app named by `celery -A app.celery_app` before it runs any
# command (worker, beat, flower, inspect, ...), and before a worker forks its pool, which
# inherits the flag. None of those commands has one start signal, and every process that
# imports this module holds the settings; flip-api's client (app/client.py) does not import
# it. Servers the local drivers start must not read this process's environment
# (app/process_guard.py).
refuse_same_user_inspection()


def _loads_message(body: Any) -> Any:
    return loads_payload(body, object_hook=kombu_json.object_hook)


# Celery's JSON with one change: a message that is valid JSON Python will not read (a
# number past the digit limit, nesting past the recursion limit) reaches its task with the
# unreadable values marked, so the task refuses and records it; kombu's own decoder would
# drop the message with a traceback, and the caller could never learn why.
serialization.register(  # type: ignore[no-untyped-call]
    "json",
    kombu_json.dumps,
    _loads_message,
    content_type="application/json",
    content_encoding="utf-8",
)

celery = Celery(
    "fl_dispatcher",
    include=["tasks.registered"],
)
# On kombu's SQL transport (the embedded default) every worker deletes the message rows its
# consumers took long ago, which kombu keeps for ever (app/broker_pruning.py).
celery.steps["consumer"].add(PruneConsumedMessages)


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """The one housekeeping schedule, from the handlers' periods (`app.handlers`); each entry
    expires before the next one is due. Every entry goes to the housekeeping queue, the
    assign round included (it is what covers a lost kick, so no backlog of requests may hold
    it), except the callback sweep, which runs beside the deliveries' own kicks."""
    from app.handlers import beat_loops

    return {
        handler.name.removeprefix(names.PREFIX).replace("_", "-"): {
            "task": handler.name,
            "schedule": timedelta(seconds=period),
            "options": {"expires": period, "queue": handler.beat_queue},
        }
        for handler, period in beat_loops(settings)
    }


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings derived from ours."""
    from app.handlers import ACKS

    transport_options: dict[str, Any] = {}
    transport: str | None = None
    if settings.broker_url.startswith(("redis://", "rediss://")):
        transport_options = {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    if settings.broker_url.startswith("redis://"):
        # kombu's Redis transport with a fix that keeps the worker alive across a Redis
        # restart (see app/redis_transport.py). Not for rediss://: kombu picks its TLS
        # defaults from that scheme name, which an explicit transport would bypass.
        transport = TRANSPORT_PATH
    # kombu's SQLAlchemy transport hands broker_transport_options to create_engine (checked
    # with Celery 5.7), so transport knobs such as polling_interval must not go there.
    return {
        "broker_url": settings.broker_url,
        "broker_transport": transport,
        "broker_transport_options": transport_options,
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "task_acks_late": ACKS.late,
        "task_acks_on_failure_or_timeout": ACKS.on_failure_or_timeout,
        "task_reject_on_worker_lost": ACKS.reject_on_worker_lost,
        # With late acks a worker holds at most `concurrency` messages, each one running:
        # a backlog stays in the broker, where the next free slot picks among the worker's
        # queues in turn (kombu's Redis transport rotates its BRPOP keys after each message,
        # the SQL transport polls them round robin), so no queue waits behind another's.
        "worker_prefetch_multiplier": 1,
        # Celery's prefork pool, except that without an event loop (kombu's SQL transport) a
        # pool process SIGKILLed while idle no longer leaves the others waiting for a lock it
        # held: the worker goes on consuming (see app/worker_pool.py).
        "worker_pool": POOL_PATH,
        "task_default_queue": names.QUEUE,
        # A worker started without -Q consumes every queue (the demo's single worker).
        "task_queues": tuple(_queue(name) for name in names.QUEUES),
        "task_routes": {task: {"queue": queue} for task, queue in names.ROUTES.items()},
        "task_send_sent_event": True,
        "worker_send_task_events": True,  # Celery Flower shows tasks live
        "worker_hijack_root_logger": False,
        "beat_schedule": beat_schedule(settings),
        # Sends only while it holds the deployment's beat lock (app/beat.py).
        "beat_scheduler": "app.beat:SingleBeatScheduler",
        "timezone": "UTC",
        "enable_utc": True,
    }


def _queue(name: str) -> Queue:
    # What Celery declares for a queue it is only told the name of: a direct exchange of the
    # same name, routed by that name.
    return Queue(name, Exchange(name), routing_key=name)  # type: ignore[no-untyped-call]


class _Configured:
    """The settings this process configured the app with, if any."""

    settings: Settings | None = None


def current_settings() -> Settings:
    """The settings this process configured the app with, else the environment's."""
    return _Configured.settings or load_settings()


def _config_on_first_use() -> dict[str, Any]:
    # `celery -A app.celery_app worker|beat|flower` never calls configure(): Celery evaluates
    # this promise the first time it reads its configuration, so the app is configured from
    # Settings (the environment) there too. configure() sets the settings first, so a process
    # that configures explicitly does not build a second Settings here.
    return celery_config(_Configured.settings or load_settings())


celery.add_defaults(_config_on_first_use)


def configure(settings: Settings) -> Celery:
    """Apply Settings to the shared app (once per process; a later call with another broker
    URL sends to that broker from then on)."""
    # Celery keeps the connection pool of its first send, bound to the broker URL of that
    # moment; conf.update alone would leave sends going to the old broker.
    previous = celery.conf.broker_url if celery.configured else None
    _Configured.settings = settings
    celery.conf.update(celery_config(settings))
    if previous is not None and previous != settings.broker_url:
        _drop_connection_pool(celery)
    return celery


def _drop_connection_pool(app: Celery) -> None:
    # What Celery itself does after a fork (Celery._after_fork), without the fork signal.
    # The pools stay open in kombu's process-wide registry (keyed by broker), where a
    # return to that broker finds them again.
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def prepare_nets_at_start(settings: Settings) -> None:
    """Every worker start (`fl-dispatcher worker` or `celery -A app.celery_app worker`)
    creates missing net rows and resets MISCONFIGURED nets (settings were just validated),
    then takes out of service a net whose admin kit (a Flower net's SuperLink certificate)
    names another server. It sends nothing: it runs before the pool and an embedded beat
    fork, which must not inherit a broker connection (`kick_when_ready` asks for the assign
    round a job it requeues needs, once they have forked)."""
    from app.adapters.net_check import endpoint_problem, record_start_check
    from app.db import make_engine, session_factory, unit_of_work
    from app.usecases import declared_nets
    from models import utcnow

    # The files first, then one transaction (`prepare_at_start`): a net whose files are still
    # wrong is never reset to STOPPED and committed before it is marked again (a claim in
    # between took it).
    problems = {}
    for net in settings.nets:
        problem = endpoint_problem(net, settings)
        if problem is not None:
            log.error("net misconfigured at start", extra={"net": net.name, "reason": problem})
            problems[net.name] = problem
    record_start_check(problems)  # this process's clients send nothing through them
    engine = make_engine(settings.database_url)
    try:
        with unit_of_work(session_factory(engine)) as session:
            declared_nets.prepare_at_start(session, settings, problems, utcnow())
    finally:
        engine.dispose()


def _on_worker_init(**_: Any) -> None:
    prepare_nets_at_start(_Configured.settings or load_settings())


signals.worker_init.connect(_on_worker_init, weak=False)


def kick_when_ready(settings: Settings) -> None:
    """Once the worker is ready, ask for an assign round if a claimable job waits
    (`kicks.kick_when_ready`), through a runtime of its own, closed after the send."""
    from app.runtime import Runtime
    from app.usecases import kicks

    rt = Runtime.from_settings(settings, outbox=CeleryOutbox(celery))
    try:
        kicks.kick_when_ready(rt)  # a broker or database down is logged, not raised
    finally:
        rt.engine.dispose()


def _on_worker_ready(**_: Any) -> None:
    # worker_ready comes in the main process after every bootstep started: the pool and an
    # embedded beat have forked, so no child inherits the connection this send opens (a
    # send from worker_init broke the embedded beat: `channel disconnected`). Pool processes
    # forked later reset it (Celery's after-fork handler).
    kick_when_ready(_Configured.settings or load_settings())


signals.worker_ready.connect(_on_worker_ready, weak=False)


def _on_worker_process_init(**_: Any) -> None:
    # Traces (TRACES=true) in each pool process, after the fork and before its first task:
    # the instrumentation must see that task start, and no exporter thread survives a fork.
    from app import traces

    traces.setup(_Configured.settings or load_settings())


def _on_worker_process_shutdown(**_: Any) -> None:
    from app import traces

    traces.flush()


signals.worker_process_init.connect(_on_worker_process_init, weak=False)
signals.worker_process_shutdown.connect(_on_worker_process_shutdown, weak=False)


class CeleryOutbox:
    """Sends follow-up tasks by name, so use cases need no task imports."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def send(self, task: str, **kwargs: Any) -> bool:
        """Send one task by name with JSON kwargs, on its queue (`names.queue_for`). Called
        after the commit that made it necessary: a broker failure is logged and reported,
        never raised (`app.publishing`)."""
        queue = names.queue_for(task)
        return published(task, lambda: self.app.send_task(task, kwargs=kwargs, queue=queue))

    def start_pipeline(self, job_id: str, net_name: str, attempt: int) -> bool:
        """scale_up -> wait_ready -> dispatch as one chain of immutable signatures, each
        bound to the job's attempt (a step of an older attempt skips). A broker failure is
        reported as False, never raised: the job stays ASSIGNED under its step lease, which
        re-drives the chain once it lapses (`app.usecases.step_leases`)."""
        ids = {"job_id": job_id, "net_name": net_name, "attempt": attempt}
        pipeline = chain(
            self.app.signature(names.SCALE_UP, kwargs=ids, immutable=True),
            self.app.signature(names.WAIT_READY, kwargs=ids, immutable=True),
            self.app.signature(names.DISPATCH, kwargs=ids, immutable=True),
        )
        return published(names.SCALE_UP, pipeline.apply_async)


def celery_runtime(settings: Settings) -> Runtime:
    """A runtime whose outbox sends through the shared app configured for `settings`: what
    a worker child, the status API and the CLI's enqueue and abort use (with TRACES=true,
    tracing on in the process: `app.traces.setup`). Its assigner kicks are coalesced
    (`app.usecases.kicks`). With callbacks on, every commit of it that moves a job also
    sends the delivery task."""
    from app import traces
    from app.parallel import Prober
    from app.runtime import Runtime
    from app.usecases.kicks import coalesce_kicks

    traces.setup(settings)  # TRACES=true: the status API's and the CLI's spans too
    rt = Runtime.from_settings(
        settings,
        outbox=CeleryOutbox(configure(settings)),
        fan_out=Prober(max_parallel=settings.housekeeping_parallel),
    )
    coalesce_kicks(rt)
    if settings.callbacks_enabled:
        from app.usecases.callbacks import send_after_commit

        send_after_commit(rt)
    return rt


def run_worker(
    settings: Settings,
    *,
    concurrency: int = 2,
    beat: bool = False,
    queues: Sequence[str] = (),
    loglevel: str | None = None,
) -> None:
    """Run a worker in this process (with an embedded beat if asked: one beat in total), on
    the given queues (none given: all of them)."""
    app = configure(settings)
    argv = [
        "worker",
        f"--loglevel={loglevel or settings.log_level}",
        f"--concurrency={concurrency}",
        f"--hostname=fl-dispatcher-{uuid.uuid4().hex[:6]}@%h",
        "--without-gossip",
        "--without-mingle",
    ]
    if queues:
        argv.append(f"--queues={','.join(queues)}")
    if beat:
        argv += ["--beat", f"--schedule={settings.data_dir.resolve() / 'celerybeat-schedule'}"]
    app.worker_main(argv)


def run_beat(settings: Settings, *, loglevel: str | None = None) -> None:
    """Run the one beat of the deployment in this process."""
    app = configure(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.start(
        [
            "beat",
            f"--loglevel={loglevel or settings.log_level}",
            f"--schedule={settings.data_dir.resolve() / 'celerybeat-schedule'}",
        ]
    )

"""A whole local fl-dispatcher stack: a provisioned NVFLARE deployment (server kit driven by
the local scale driver, two sites running), a migrated database, and a real Celery worker and
beat as subprocesses. Used by `fl-dispatcher demo` and by the end-to-end tests.

Processes are always cleaned up (`close()`, also on errors), so nothing is left behind.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select

from app import migrate
from app.adapters.drivers import build_driver
from app.adapters.drivers.local import LocalDriver
from app.client import DispatcherClient
from app.db import make_engine, session_factory, unit_of_work
from app.local.nvflare import (
    Deployment,
    ProcessHandle,
    build_tiny_job,
    provision,
    start_site,
    stop,
)
from app.local.settings_folder import NETS_FILE, write_settings_folder
from app.net_config import FlowerLocalDriverConfig, LocalDriverConfig
from app.process_control import terminate_tree
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases.declared_nets import sync_nets
from models import Job, JobEvent, Net, NetEvent, utcnow

log = logging.getLogger(__name__)
T = TypeVar("T")
SETTING_NAMES = {f.alias for f in Settings.model_fields.values() if f.alias}

NET = "local-net"
JOB_NAME = "tiny-fedavg"
SETTINGS_HEADER = """The settings this folder's worker ran with (its nets: nets.toml beside it):
  fl-dispatcher --env-file THIS_FILE status      (and jobs, job, api for /fl/status, /nets)
shows what ran here. Callback settings and secrets are not written."""


@dataclass
class StackOptions:
    """Knobs of a local stack; defaults suit the demo (seconds, not minutes)."""

    workdir: Path
    database_url: str | None = None  # None: SQLite in workdir (the embedded default)
    broker_url: str | None = None  # None: kombu's SQLAlchemy transport on SQLite in workdir
    per_job_fl_server: bool = True
    idle_timeout_s: float = 6.0
    ready_timeout_s: float = 120.0
    housekeeping_interval_s: float = 2.0
    server_lost_grace_s: float = 20.0
    stuck_after_s: float = 60.0
    embedded_beat: bool = True  # worker --beat (one process) or a separate beat process
    concurrency: int = 2
    api_port: int | None = None  # also serve the status HTTP API on this loopback port
    extra_env: dict[str, str] = field(default_factory=dict)
    nvflare: bool = True  # provision the NVFLARE net `local-net` and start its two sites
    # Further nets, as NETS declares them (a Flower net: its SuperNodes are the caller's).
    extra_nets: list[dict[str, Any]] = field(default_factory=list)
    flwr_venv: Path | None = None  # FLWR_VENV, for a Flower net on the local driver


class LocalStack:
    """Start with `start()`, always `close()`; use as a context manager."""

    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self.workdir = options.workdir.resolve()
        self.deployment: Deployment | None = None
        self.sites: dict[str, ProcessHandle] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.env: dict[str, str] = {}
        self.settings: Settings | None = None
        self.env_file: Path | None = None
        self._client: DispatcherClient | None = None

    def __enter__(self) -> LocalStack:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- setup ----------------------------------------------------------------------

    def start(self) -> None:
        """Provision, migrate, start the sites, then the worker (and beat)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.options.nvflare:
            self.deployment = provision(self.workdir / "nvflare")
        job_root = self.workdir / "jobs"
        if self.options.nvflare:
            build_tiny_job(job_root / JOB_NAME)
        else:
            job_root.mkdir(exist_ok=True)  # the caller's jobs only (a Flower App, say)
        # The folder's own settings, what the worker runs with (its NETS_FILE is this
        # nets.toml): `status`, `jobs` and the status API read them with --env-file.
        settings = {**self._settings_kwargs(job_root), **self.options.extra_env}
        self.env_file = write_settings_folder(
            self.workdir,
            {k: v for k, v in settings.items() if k in SETTING_NAMES},  # not AWS_* and such
            [*([self._net()] if self.options.nvflare else []), *self.options.extra_nets],
            SETTINGS_HEADER,
        )
        self.env = self._env(job_root)
        self.settings = Settings(**self._settings_kwargs(job_root))
        migrate.upgrade(self.settings.database_url)
        declare_net_rows(self.settings)
        for name, kit in self.deployment.site_kits.items() if self.deployment else ():
            self.sites[name] = start_site(kit, log_dir=self.workdir / "logs")
        self.start_worker()

    def _net(self) -> dict[str, Any]:
        """The stack's one net, as NETS declares it."""
        assert self.deployment is not None
        opts = self.options
        return {
            "name": NET,
            "driver": {"kind": "local", "server_kit_dir": str(self.deployment.server_kit)},
            "admin": {
                "kit_dir": str(self.deployment.admin_kit),
                "username": self.deployment.admin_user,
            },
            "idle_timeout_s": opts.idle_timeout_s,
            "ready_timeout_s": opts.ready_timeout_s,
            "required_sites": sorted(self.deployment.site_kits),
        }

    def _settings_kwargs(self, job_root: Path) -> dict[str, Any]:
        opts = self.options
        data = self.workdir / "data"
        return {
            "FL_DISPATCHER_DATA_DIR": data,
            "DATABASE_URL": opts.database_url or f"sqlite:///{data / 'fl-dispatcher.db'}",
            "BROKER_URL": opts.broker_url or f"sqla+sqlite:///{data / 'broker.db'}",
            "PER_JOB_FL_SERVER": opts.per_job_fl_server,
            "NETS_FILE": self.workdir / NETS_FILE,
            "JOB_ROOT": job_root,
            "HOUSEKEEPING_INTERVAL_S": opts.housekeeping_interval_s,
            "SERVER_LOST_GRACE_S": opts.server_lost_grace_s,
            "STUCK_AFTER_S": opts.stuck_after_s,
            "READY_POLL_S": 0.5,
            "ADMIN_LOGIN_TIMEOUT_S": 5.0,
            "ADMIN_COMMAND_TIMEOUT_S": 10.0,
        } | ({"FLWR_VENV": opts.flwr_venv} if opts.flwr_venv is not None else {})

    def _env(self, job_root: Path) -> dict[str, str]:
        """The environment the worker and beat get: exactly the stack's settings."""
        kwargs = self._settings_kwargs(job_root)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("NETS", "DATABASE_URL", "FL_DISPATCHER_ENV_FILE"))
        }
        env |= {key: _env_value(value) for key, value in kwargs.items()}
        env |= self.options.extra_env
        return env

    def start_worker(self) -> None:
        """Start the worker (with beat embedded unless options say otherwise)."""
        self.start_process("worker")
        if not self.options.embedded_beat:
            self.start_process("beat")
        if self.options.api_port is not None:
            self.start_process("api")

    def start_process(self, name: str) -> None:
        """Start one of the stack's processes, `worker` or `beat` (again, after a crash:
        in production the container's restart policy does this)."""
        cli = [sys.executable, "-m", "app.entrypoints.cli"]
        if name == "worker":
            argv = [*cli, "worker", f"--concurrency={self.options.concurrency}"]
            if self.options.embedded_beat:
                argv.append("--beat")
        elif name == "beat" and not self.options.embedded_beat:
            argv = [*cli, "beat"]
        elif name == "api" and self.options.api_port is not None:
            argv = [*cli, "api", "--host", "127.0.0.1", "--port", str(self.options.api_port)]
        else:
            raise ValueError(f"no such stack process: {name!r}")
        running = self.processes.get(name)
        if running is not None and running.poll() is None:
            raise RuntimeError(f"{name} is already running (pid {running.pid})")
        self.processes[name] = self._spawn(name, argv)

    def kill_process(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one process's whole group (SIGKILL: a crash, no shutdown, no acks) and
        forget it, so `wait_for` does not report the death the test caused."""
        _stop_group(self.processes.pop(name), sig)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log_path = self.workdir / f"{name}.log"
        with log_path.open("ab") as out:
            return subprocess.Popen(
                argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: we can stop the whole tree
                cwd=self.workdir,
            )

    def stop_worker(self, sig: int = signal.SIGTERM) -> None:
        """Stop the worker and beat processes (their whole process groups)."""
        for name in list(self.processes):
            _stop_group(self.processes.pop(name), sig)

    # --- use ------------------------------------------------------------------------

    @property
    def client(self) -> DispatcherClient:
        """flip-api's client, on the stack's broker."""
        if self._client is None:
            assert self.settings is not None
            self._client = DispatcherClient(self.settings.broker_url)
        return self._client

    def enqueue(self, key: str, definition: str = JOB_NAME, **overrides: Any) -> uuid.UUID:
        """Enqueue a job (the tiny one unless told) through the public task, as flip-api
        would."""
        overrides.setdefault("net", NET)
        request = EnqueueJob(caller_key=key, definition=definition, **overrides)
        return self.client.enqueue_job(request)

    def add_job_definition(self, name: str, num_rounds: int) -> str:
        """A further tiny FedAvg job under the stack's job root (more rounds run longer)."""
        build_tiny_job(self.workdir / "jobs" / name, name=name, num_rounds=num_rounds)
        return name

    def kill_server(self) -> bool:
        """SIGKILL the net's NVFLARE server and the job processes it spawned (a crashed
        container); False if none was running. The driver still wants it up."""
        server = self.driver().server_process()
        if server is None:
            return False
        pid, ticks = server
        terminate_tree(pid, sig=signal.SIGKILL, expected_ticks=ticks)
        return True

    def job_store_runs(self) -> list[dict[str, Any]]:
        """Every run the server's job store holds (read from its folder, so it also works
        while the server is down): the meta of each, with `job_id` and `submit_token`."""
        assert self.deployment is not None
        store = self.deployment.workspace / self.deployment.project / "server-store"
        runs = []
        for meta in sorted((store / "jobs-storage").glob("*/meta")):
            runs.append(json.loads(meta.read_text()))
        return runs

    def driver(self, name: str = NET) -> LocalDriver:
        """A local driver on a net's server (the same PID file the worker uses)."""
        assert self.settings is not None
        driver = build_driver(self.settings.net(name), self.settings)
        assert isinstance(driver, LocalDriver)  # a Flower net's too (SuperLinkDriver)
        return driver

    def read(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(session)` on a short read-only session."""
        assert self.settings is not None
        engine = _engine(self.settings.database_url)
        with session_factory(engine)() as session:
            return fn(session)

    def job(self, job_id: uuid.UUID) -> Job | None:
        """The job row, or None before the worker has created it."""
        job: Job | None = self.read(lambda s: s.get(Job, job_id))
        return job

    def net(self, name: str = NET) -> Net:
        """The net's row."""
        net: Net | None = self.read(lambda s: s.get(Net, name))
        assert net is not None, "net row missing: has the worker started?"
        return net

    def events_since(self, job_after: int, net_after: int) -> tuple[list[JobEvent], list[NetEvent]]:
        """History rows newer than the given ids."""
        return self.read(
            lambda s: (
                list(
                    s.scalars(select(JobEvent).where(JobEvent.id > job_after).order_by(JobEvent.id))
                ),
                list(
                    s.scalars(select(NetEvent).where(NetEvent.id > net_after).order_by(NetEvent.id))
                ),
            )
        )

    def wait_for(
        self, what: str, predicate: Callable[[], T | None], timeout_s: float, poll_s: float = 0.25
    ) -> T:
        """Poll `predicate` until it returns something truthy; fail with `what` and the logs."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited ({process.returncode}) while waiting for "
                        f"{what}; see {self.workdir / (name + '.log')}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"timed out after {timeout_s:.0f}s waiting for {what}; logs in {self.workdir}"
                )
            time.sleep(poll_s)

    # --- teardown -------------------------------------------------------------------

    def close(self) -> None:
        """Stop everything this stack started, whatever state it is in."""
        self.stop_worker()
        if self._client is not None:
            self._client.close()
        local = (LocalDriverConfig, FlowerLocalDriverConfig)
        for net in self.settings.nets if self.settings is not None else ():
            try:
                if isinstance(net.driver, local):
                    self.driver(net.name).scale(0)
            except Exception:  # teardown must go on to the other nets and the sites
                log.exception("stopping net %s's local server failed", net.name)
        for handle in self.sites.values():
            stop(handle)
        self.sites.clear()
        if self.settings is not None:
            _engine(self.settings.database_url).dispose()


_ENGINES: dict[str, Any] = {}


def declare_net_rows(settings: Settings) -> None:
    """Create the stack's net rows now (its worker does it too, but only once it has
    booted), so a job can be enqueued at once; no more: a worker's start alone may reset a
    MISCONFIGURED net, once it has checked the net's files."""
    with unit_of_work(session_factory(_engine(settings.database_url))) as session:
        sync_nets(session, settings, utcnow())


def _engine(url: str) -> Any:
    if url not in _ENGINES:
        _ENGINES[url] = make_engine(url)
    return _ENGINES[url]


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _stop_group(process: subprocess.Popen[bytes], sig: int, timeout_s: float = 20.0) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass

"""The deployment the simulated workers run in: settings as the environment would give them
for a world (and for what NETS declares after redeploys), and beat's schedule."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.settings import Settings
from app.sim.db import scratch_dir
from app.sim.receiver import SECRET, URL
from app.sim.workload import NetSpec, WorldSpec


@dataclass
class Declared:
    """What NETS declares now: the nets in order, and per-net PER_JOB_FL_SERVER overrides
    (a redeploy changes it: tests.sim.redeploy)."""

    nets: list[NetSpec]
    per_job: dict[str, bool]

    def names(self) -> list[str]:
        return [n.name for n in self.nets]


def settings_for(
    world: WorldSpec,
    per_job_fl_server: bool,
    declared: Declared | None = None,
    root: Path | None = None,
) -> Settings:
    """Settings as the deployment's environment would give them, for this world (and what
    NETS declares after redeploys); `root` holds the simulation's job root and data folder
    (its bundles, caches and prepared copies are its own)."""
    kit = scratch_dir() / "kit"
    if not (kit / "startup" / "fed_admin.json").is_file():
        (kit / "startup").mkdir(parents=True, exist_ok=True)
        (kit / "startup" / "fed_admin.json").write_text("{}")
    if root is None:
        root = scratch_dir()
        # A minimal bundle as NVFLARE exports one: an app folder and a meta.json deploy map.
        (root / "jobs" / "job" / "app" / "config").mkdir(parents=True, exist_ok=True)
        (root / "jobs" / "job" / "meta.json").write_text(
            '{"name": "job", "deploy_map": {"app": ["@ALL"]}, "min_clients": 2}'
        )
    nets = []
    per_job = declared.per_job if declared is not None else {}
    for net in declared.nets if declared is not None else world.nets:
        driver: dict[str, object] = {"kind": net.kind}
        if net.kind == "ecs":
            driver |= {"region": "eu-west-2", "cluster": "sim", "service": f"fl-{net.name}"}
        # How the workers reach the net's server: an NVFLARE admin kit, or a SuperLink's
        # Control API (its address; TLS against the system's CAs).
        server: dict[str, object] = {"admin": {"kit_dir": str(kit), "username": "admin"}}
        if net.backend == "flower":
            server = {"backend": "flower", "flower": {"address": f"{net.name}.superlink:9093"}}
        nets.append(
            {
                "name": net.name,
                "driver": driver,
                **server,
                "required_sites": list(net.sites),
                "idle_timeout_s": net.idle_timeout_s,
                "ready_timeout_s": net.ready_timeout_s,
                "per_job_fl_server": per_job.get(net.name),
                "sites": list(net.sites) if net.declares_sites else None,
            }
        )
    extra: dict[str, Any] = {}
    if world.project_shares:
        extra["PROJECT_SHARES"] = world.project_shares
    if world.aging_s is not None:
        extra["AGING_S"] = world.aging_s
    if world.callbacks:
        extra |= {
            "CALLBACK_URL": URL,
            "CALLBACK_SECRET": SECRET,
            "CALLBACK_TIMEOUT_S": 5.0,
            "CALLBACK_MAX_BACKOFF_S": world.callback_max_backoff_s,
            "CALLBACK_EVENTS_PER_READ": world.callback_events_per_read,
        }
    return Settings(
        **extra,
        FL_DISPATCHER_DATA_DIR=root / "data",
        DATABASE_URL="sqlite://",
        JOB_ROOT=root / "jobs",
        NETS=json.dumps(nets),
        PER_JOB_FL_SERVER="true" if per_job_fl_server else "false",
        MAX_ATTEMPTS=world.max_attempts,
        LOST_JOB_POLICY=world.lost_job_policy,
        MAX_RUN_S=world.max_run_s,
        ABORT_TIMEOUT_S=world.abort_timeout_s,  # ignored by code that predates it
        SERVER_LOST_GRACE_S=world.server_lost_grace_s,
        STUCK_AFTER_S=world.stuck_after_s,
        READY_POLL_S=world.ready_poll_s,
        RETRY_MAX=world.retry_max,
        RETRY_BACKOFF_MAX_S=world.retry_backoff_max_s,
        HOUSEKEEPING_INTERVAL_S=world.housekeeping_interval_s,
        KEEP_ALIVE_INTERVAL_S=world.keep_alive_interval_s,
        AWAITED_POLL_S=world.awaited_poll_s,
        RELEASE_AFTER=world.release_after,
        REPORT_TIMEOUT_S=world.report_timeout_s,
        PREWARM_MAX_S=world.prewarm_max_s,
    )


def always_on(settings: Settings, net: str) -> bool:
    """The settings' verdict on a net (one place, as the API for it is changing)."""
    config = settings.net(net)
    flag = getattr(config, "always_on", None)
    if isinstance(flag, bool):
        return flag
    return bool(getattr(settings, "is_always_on")(config))  # noqa: B009 (gone on main)

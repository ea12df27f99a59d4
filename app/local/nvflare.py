"""A local NVFLARE deployment: provision it, start and stop its processes, build a tiny job.

Used by the demo and the integration/e2e tests (the local scale driver uses only
`app.adapters.nvflare.participants` and `app.process_control`, never this harness).
Everything stays inside the given workspace and on loopback: provisioning runs nvflare's own
provisioner in-process (no `nvflare poc`, so nothing is written under the real HOME), and the
server's job store is moved from nvflare's default `/tmp/nvflare` into the workspace so two
deployments on one machine never share state.

Processes are started without nvflare's watchdog (`sub_start.sh` restarts a dead process after
5 s; we want "stopped" to mean stopped): we run the exact python command line `sub_start.sh
--once` would exec, with this interpreter, each in its own session so that stopping the group
also stops the job processes the server or a site spawned.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.adapters.nvflare.participants import (
    LOOPBACK_HOST,
    ProcessHandle,
    kill,
    server_endpoint,
    start_site,
    stop,
)
from app.adapters.nvflare.participants import start_server as _start_kit
from app.process_control import free_port

logger = logging.getLogger(__name__)

# The server participant is named after the host the sites and admins dial, so the server's
# certificate CN, its identity in every kit and its target all read `localhost`.
SERVER_NAME = LOOPBACK_HOST
_ORG = "nvidia"
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class Deployment:
    """A provisioned project: one server, its sites and one admin user, on loopback."""

    workspace: Path
    project: str
    port: int
    server_kit: Path  # participant folder holding startup/fed_server.json
    site_kits: dict[str, Path]
    admin_kit: Path  # participant folder holding startup/fed_admin.json
    admin_user: str
    host: str = LOOPBACK_HOST

    @property
    def sites(self) -> tuple[str, ...]:
        """The site names, in provisioning order."""
        return tuple(self.site_kits)


# --- provisioning ---------------------------------------------------------------------------


class _ProvisionLog:
    """nvflare's provisioner prints to stdout unless given an object with these four methods."""

    def debug(self, msg: str) -> None:
        logger.debug("provision: %s", msg)

    def info(self, msg: str) -> None:
        logger.debug("provision: %s", msg)

    def warning(self, msg: str) -> None:
        logger.warning("provision: %s", msg)

    def error(self, msg: str) -> None:
        logger.error("provision: %s", msg)


def _project_dict(
    project: str, port: int, sites: Sequence[str], admin: str, server_name: str = SERVER_NAME
) -> dict[str, Any]:
    participants: list[dict[str, Any]] = [
        {
            "name": server_name,
            "type": "server",
            "org": _ORG,
            # FL and admin traffic share one port in 2.9.
            "fed_learn_port": port,
            "admin_port": port,
        }
    ]
    participants += [{"name": site, "type": "client", "org": _ORG} for site in sites]
    participants.append({"name": admin, "type": "admin", "org": _ORG, "role": "project_admin"})
    return {
        "api_version": 3,
        "name": project,
        "description": "local deployment provisioned by fl-dispatcher",
        "participants": participants,
        "builders": [
            {
                "path": "nvflare.lighter.impl.workspace.WorkspaceBuilder",
                "args": {"template_file": ["master_template.yml"]},
            },
            {
                "path": "nvflare.lighter.impl.static_file.StaticFileBuilder",
                "args": {"config_folder": "config"},
            },
            {"path": "nvflare.lighter.impl.cert.CertBuilder"},
            {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
        ],
    }


def _localize_server_storage(server_kit: Path, store_dir: Path) -> None:
    """Point the server's job store and snapshots into the workspace (default: /tmp/nvflare)."""
    local = server_kit / "local"
    resources = json.loads((local / "resources.json.default").read_text())
    storage = resources["snapshot_persistor"]["args"]["storage"]["args"]
    storage["root_dir"] = str(store_dir / "snapshot-storage")
    for component in resources["components"]:
        if component.get("id") == "job_manager":
            component["args"]["uri_root"] = str(store_dir / "jobs-storage")
    (local / "resources.json").write_text(json.dumps(resources, indent=2))


def provision(
    workspace: Path,
    *,
    project: str = "fl-dispatcher",
    port: int | None = None,
    sites: Sequence[str] = ("site-1", "site-2"),
    admin: str = "admin@nvidia.com",
    server_name: str = SERVER_NAME,
    store_dir: Path | None = None,
) -> Deployment:
    """Provision a server, `sites` and one project admin into `workspace/<project>/`.

    Each project gets its own root CA, so a second project is an unrelated deployment whose
    kits the first one's server rejects. The server's identity and every target read
    `<server_name>:<port>` (`localhost` unless given: a container network's name for the
    server, say); `port` defaults to a free one. The server keeps its job store in
    `store_dir` as the server sees it (default: in the workspace; a container mounts the
    kit elsewhere).
    """
    from nvflare.lighter.constants import CtxKey
    from nvflare.lighter.prov_utils import prepare_builders, prepare_packager
    from nvflare.lighter.provision import prepare_project
    from nvflare.lighter.provisioner import Provisioner

    workspace = workspace.resolve()
    chosen_port = port if port is not None else free_port()
    project_dict = _project_dict(project, chosen_port, tuple(sites), admin, server_name)
    root = workspace / "provision"
    root.mkdir(parents=True, exist_ok=True)
    provisioner = Provisioner(
        str(root), prepare_builders(project_dict), prepare_packager(project_dict)
    )
    ctx = provisioner.provision(
        prepare_project(copy.deepcopy(project_dict)), logger=_ProvisionLog()
    )
    if ctx.get(CtxKey.BUILD_ERROR):
        raise RuntimeError(f"provisioning {project!r} failed: {ctx.get(CtxKey.ERRORS)}")
    prod = Path(ctx[CtxKey.CURRENT_PROD_DIR])
    server_kit = prod / server_name
    _localize_server_storage(server_kit, store_dir or workspace / project / "server-store")
    return Deployment(
        workspace=workspace,
        project=project,
        port=chosen_port,
        server_kit=server_kit,
        site_kits={site: prod / site for site in sites},
        admin_kit=prod / admin,
        admin_user=admin,
        host=server_name,
    )


def start_server(
    target: Deployment | Path,
    *,
    log_dir: Path | None = None,
    track: bool = True,
    name: str = "server",
) -> ProcessHandle:
    """Start the server of a deployment (or a server kit folder); returns at once."""
    kit = target.server_kit if isinstance(target, Deployment) else target
    return _start_kit(kit, log_dir=log_dir, track=track, name=name)


__all__ = [
    "Deployment",
    "ProcessHandle",
    "build_tiny_job",
    "kill",
    "provision",
    "server_endpoint",
    "start_server",
    "start_site",
    "stop",
]


# --- a tiny real job ------------------------------------------------------------------------

_TINY_CLIENT_SCRIPT = '''\
"""Tiny FedAvg client: add one to every weight and send it back."""

import nvflare.client as flare

flare.init()
while flare.is_running():
    model = flare.receive()
    if model is None:
        break
    params = {key: value + 1 for key, value in model.params.items()}
    flare.send(flare.FLModel(params=params, metrics={"accuracy": 1.0}))
'''


def _make_script_path_relative(job_dir: Path, script: Path) -> None:
    """The recipe copies the script into the job's custom/ folder but keeps the absolute path
    it was given in the client config; a relative name is looked up in custom/ at run time
    (nvflare 2.9 task_script_runner), so the job does not depend on this machine's files."""
    for config in job_dir.glob("**/config_fed_client.json"):
        config.write_text(config.read_text().replace(json.dumps(str(script)), '"client.py"'))


def build_tiny_job(
    dest: Path, name: str = "tiny-fedavg", num_rounds: int = 2, sites: int = 2
) -> Path:
    """Export a tiny numpy FedAvg job (`name`, `sites` sites, `num_rounds` rounds) with
    nvflare's recipe API into the job folder `dest` (replaced if present); returns `dest`.

    NVFLARE accepts a job folder only if its name has letters, digits, dots, underscores and
    hyphens, so `dest.name` and `name` are checked here rather than at submit time.
    """
    for label, value in (("job folder", dest.name), ("job name", name)):
        if not _JOB_NAME_RE.match(value):
            raise ValueError(
                f"{label} {value!r}: use only letters, digits, dots, underscores, hyphens"
            )
    from nvflare.app_common.np.recipes.fedavg import NumpyFedAvgRecipe

    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}-", dir=dest.parent) as tmp:
        script = Path(tmp) / "client.py"
        script.write_text(_TINY_CLIENT_SCRIPT)
        recipe = NumpyFedAvgRecipe(
            name=name,
            min_clients=sites,
            num_rounds=num_rounds,
            model=[[1.0, 2.0], [3.0, 4.0]],
            train_script=str(script),
        )
        out = Path(tmp) / "out"
        recipe.export(str(out))  # writes out/<name>/{meta.json,app/...}
        _make_script_path_relative(out / name, script)
        if dest.exists():
            shutil.rmtree(dest)
        (out / name).rename(dest)
    return dest

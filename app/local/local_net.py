"""`fl-dispatcher local-net DIR`: a local NVFLARE net of the user's own, without the demo.

Provisions a server, one admin and N sites (nvflare's provisioner, in-process, on loopback)
into DIR/kits, exports a tiny FedAvg job into DIR/jobs, and writes the folder's settings
(DIR/nets.toml with the net's entry, DIR/fl-dispatcher.env naming it, a data folder in
DIR/data). The local scale driver starts the server when a job needs it; the sites are the
user's to start (`fl-dispatcher participant DIR/kits/site-1`), and reconnect to the server
whenever it comes up. README "After the demo" walks through it; an e2e test follows
the same steps.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.local.nvflare import SERVER_NAME, build_tiny_job, provision
from app.local.settings_folder import ENV_FILE, NETS_FILE, nets_toml, write_settings_folder

JOB_NAME = "tiny-fedavg"
DEFAULT_ADMIN = "admin@nvidia.com"
IDLE_TIMEOUT_S = 60  # a local try: the server goes down a minute after its job
HEADER = """Settings of the local net in this folder (made by `fl-dispatcher local-net`); its
entry is in nets.toml beside it. Read them with
  fl-dispatcher --env-file THIS_FILE COMMAND"""


@dataclass(frozen=True)
class LocalNet:
    """What `local-net` made: the net's declaration and where everything is."""

    folder: Path
    net: dict[str, Any]
    site_kits: dict[str, Path]
    env_file: Path
    nets_file: Path
    job: str

    @property
    def entry(self) -> str:
        """The net's `[[nets]]` entry, as written to nets.toml."""
        return nets_toml([self.net])


def net_entry(folder: Path, *, name: str, sites: list[str], admin: str) -> dict[str, Any]:
    """The net's declaration, its kits in `folder/kits` (the server's folder named after
    the host the kits dial: app.local.nvflare.SERVER_NAME)."""
    kits = folder / "kits"
    return {
        "name": name,
        "idle_timeout_s": IDLE_TIMEOUT_S,
        "required_sites": sites,
        "sites": sites,
        "driver": {"kind": "local", "server_kit_dir": str(kits / SERVER_NAME)},
        "admin": {"kit_dir": str(kits / admin), "username": admin},
    }


def make_local_net(
    folder: Path,
    *,
    name: str = "local-net",
    sites: int = 2,
    port: int | None = None,
    admin: str = DEFAULT_ADMIN,
) -> LocalNet:
    """Provision the net into `folder` (new, or empty) and write its settings there."""
    folder = folder.resolve()
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"{folder} is not empty: give a new folder for the net")
    if sites < 1:
        raise ValueError("a net needs at least one site")
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"site-{i}" for i in range(1, sites + 1)]
    deployment = provision(
        folder / "nvflare",
        project=name,
        port=port,
        sites=names,
        admin=admin,
        store_dir=folder / "server-store",
    )
    # The kits hold no path of their own folder (the server's store is outside it), so
    # they move to a short, fixed place the README can name.
    shutil.move(deployment.server_kit.parent, folder / "kits")
    shutil.rmtree(folder / "nvflare")
    net = net_entry(folder, name=name, sites=names, admin=admin)
    kits = folder / "kits"
    build_tiny_job(folder / "jobs" / JOB_NAME, sites=sites)
    settings = {
        "FL_DISPATCHER_DATA_DIR": folder / "data",
        "JOB_ROOT": folder / "jobs",
        "PER_JOB_FL_SERVER": True,
    }
    env_file = write_settings_folder(folder, settings, [net], HEADER)
    return LocalNet(
        folder=folder,
        net=net,
        site_kits={site: kits / site for site in names},
        env_file=env_file,
        nets_file=folder / NETS_FILE,
        job=JOB_NAME,
    )


def next_steps(made: LocalNet) -> str:
    """What to run now, in order (the README's steps, with this folder's paths)."""
    cli = f"fl-dispatcher --env-file {made.env_file}"
    sites = "".join(f"  fl-dispatcher participant {kit} &\n" for kit in made.site_kits.values())
    return (
        f"local net {made.net['name']} in {made.folder}: its entry is in {made.nets_file}, "
        f"its settings in {made.folder / ENV_FILE}. Next:\n"
        f"{sites}"
        f"  {cli} db upgrade\n"
        f"  {cli} worker --beat &\n"
        f"  {cli} enqueue --key my-first-job --definition {made.job} --net {made.net['name']}\n"
        f"  {cli} job --key my-first-job\n"
    )

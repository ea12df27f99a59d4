"""`fl-dispatcher local-net DIR`: a local NVFLARE net of the user's own, without the demo.

Provisions a server, one admin and N sites (nvflare's provisioner, in-process, on loopback)
into DIR/kits, exports a tiny FedAvg job into DIR/jobs, and writes the folder's settings
(DIR/nets.toml with the net's entry, DIR/fl-dispatcher.env naming it and the folder's own
database and broker in DIR/data). Built in a hidden sibling and renamed into place, so a
failure leaves no half-made folder. The local scale driver starts the server when a job
needs it; the sites are the user's to start (`fl-dispatcher participant DIR/kits/site-1`),
and reconnect to the server whenever it comes up. README "After the demo" walks through
it; an e2e test follows the same steps.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.local.nvflare import SERVER_NAME, build_tiny_job, provision
from app.local.settings_folder import (
    ENV_FILE,
    NETS_FILE,
    nets_toml,
    settings_folder_texts,
    shell_word,
)
from app.schemas import NET_NAME_PATTERN

JOB_NAME = "tiny-fedavg"
DEFAULT_ADMIN = "admin@nvidia.com"
IDLE_TIMEOUT_S = 60  # a local try: the server goes down a minute after its job
MAX_PORT = 65535
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


def _refuse_what_the_net_cannot_take(name: str, sites: int, port: int | None) -> None:
    """ValueError for a name the folder's own nets file would refuse, no site, or a port no
    server can listen on: said before anything is made."""
    if not re.match(NET_NAME_PATTERN, name):
        raise ValueError(
            f"net name {name!r}: a nets file takes 1 to 63 lowercase letters, digits, '_' "
            "and '-', starting with a letter or a digit"
        )
    if sites < 1:
        raise ValueError("a net needs at least one site")
    if port is not None and not 1 <= port <= MAX_PORT:
        raise ValueError(f"port {port}: a server listens on a port from 1 to {MAX_PORT}")


def _settings(folder: Path) -> dict[str, object]:
    """The folder's settings: its own embedded database and broker named, so that an
    exported FL_DISPATCHER_DATA_DIR (the environment wins) cannot point them elsewhere."""
    data = folder / "data"
    return {
        "FL_DISPATCHER_DATA_DIR": data,
        "DATABASE_URL": f"sqlite:///{data / 'fl-dispatcher.db'}",
        "BROKER_URL": f"sqla+sqlite:///{data / 'broker.db'}",
        "JOB_ROOT": folder / "jobs",
        "PER_JOB_FL_SERVER": True,
    }


def make_local_net(
    folder: Path,
    *,
    name: str = "local-net",
    sites: int = 2,
    port: int | None = None,
    admin: str = DEFAULT_ADMIN,
) -> LocalNet:
    """Provision the net into `folder` (new, or empty) and write its settings there; on any
    failure the folder is left as it was (built beside it, then renamed into place)."""
    folder = folder.resolve()
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"{folder} is not empty: give a new folder for the net")
    _refuse_what_the_net_cannot_take(name, sites, port)
    names = [f"site-{i}" for i in range(1, sites + 1)]
    net = net_entry(folder, name=name, sites=names, admin=admin)
    # Every file names the folder's final paths; written first, so that a value no settings
    # file can hold stops before anything is provisioned.
    texts = settings_folder_texts(folder, _settings(folder), [net], HEADER)
    made_parents = [p for p in reversed(folder.parents) if not p.exists()]
    folder.parent.mkdir(parents=True, exist_ok=True)
    # A hidden sibling, made with the umask's permissions (mkdtemp's would be 0700).
    building = folder.parent / f".{folder.name}.{secrets.token_hex(4)}.partial"
    building.mkdir()
    try:
        _build(building, folder, name=name, sites=names, port=port, admin=admin)
        for file_name, text in texts.items():
            (building / file_name).write_text(text)
        building.rename(folder)  # replaces an empty folder; refused if one appeared meanwhile
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        for parent in reversed(made_parents):
            with contextlib.suppress(OSError):
                parent.rmdir()  # only while still empty
        raise
    return LocalNet(
        folder=folder,
        net=net,
        site_kits={site: folder / "kits" / site for site in names},
        env_file=folder / ENV_FILE,
        nets_file=folder / NETS_FILE,
        job=JOB_NAME,
    )


def _build(
    building: Path, folder: Path, *, name: str, sites: list[str], port: int | None, admin: str
) -> None:
    """Provision the kits and export the job into `building`, which becomes `folder`."""
    deployment = provision(
        building / "nvflare",
        project=name,
        port=port,
        sites=sites,
        admin=admin,
        store_dir=folder / "server-store",  # as the server will see it, once renamed
    )
    # The kits hold no path of their own folder (the server's store is outside it), so
    # they move to a short, fixed place the README can name.
    shutil.move(deployment.server_kit.parent, building / "kits")
    shutil.rmtree(building / "nvflare")
    build_tiny_job(building / "jobs" / JOB_NAME, sites=len(sites))


def next_steps(made: LocalNet) -> str:
    """What to run now, in order (the README's steps, with this folder's paths, each
    quoted where a shell needs it)."""
    cli = f"fl-dispatcher --env-file {shell_word(made.env_file)}"
    sites = "".join(
        f"  fl-dispatcher participant {shell_word(kit)} &\n" for kit in made.site_kits.values()
    )
    return (
        f"local net {made.net['name']} in {made.folder}: its entry is in {made.nets_file}, "
        f"its settings in {made.folder / ENV_FILE}. Next:\n"
        f"{sites}"
        f"  {cli} db upgrade\n"
        f"  {cli} worker --beat &\n"
        f"  {cli} enqueue --key my-first-job --definition {made.job} --net {made.net['name']}\n"
        f"  {cli} job --key my-first-job\n"
    )

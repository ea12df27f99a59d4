"""A local Flower federation for `fl-dispatcher demo --backend flower` (and the tests' own,
tests/fixtures/flower.py): flwr's virtualenv, a test CA, the SuperNodes' keys and
registration, the SuperNodes as processes, and a tiny Flower App.

flwr cannot be installed beside the service's dependencies (tests/README.md "Dependencies"),
so its SuperLink and SuperNodes run from a virtualenv of their own, made from the hash-locked
`.ci/flower.lock` of a checkout (`ensure_flower_venv`): once per lock content, kept under the
system's temporary folder and reused (one left half-made is made again). The SuperLink is
the net's, started and stopped by the worker's local driver (drivers/local_superlink.py);
the SuperNodes are the sites', started here, registered by name with their public keys
(SuperNode authentication, which needs TLS: what names a SuperNode for `required_sites`).
Every process has an FLWR_HOME under the federation's folder, which finds them all at the
end, the ones whose parent exited too.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import ipaddress
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import process_control
from app.adapters.child_env import child_environment

LOCK = Path(__file__).resolve().parents[2] / ".ci" / "flower.lock"
SITES = ("site-1", "site-2")
INSTALL_TIMEOUT_S = 900.0
NODES_TIMEOUT_S = 60.0  # measured ~2 s from a SuperNode's start to online


def flower_venv_path(lock: Path = LOCK) -> Path:
    """Where the venv for the lock's current content lives (one per lock content)."""
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"fl-dispatcher-flower-{digest}"


def flower_venv_ready(lock: Path = LOCK) -> bool:
    """Whether the lock's venv is made already (no install needed)."""
    return lock.is_file() and (flower_venv_path(lock) / ".complete").exists()


def ensure_flower_venv(lock: Path = LOCK) -> Path:
    """The Flower virtualenv, made from `lock` if it is not there yet; under a file lock, so
    parallel makers make it once. RuntimeError without the lock (not a checkout)."""
    if not lock.is_file():
        raise RuntimeError(
            f"{lock} is missing (not a checkout of fl-dispatcher): set FLWR_VENV to a "
            "virtualenv holding flwr 1.42"
        )
    venv = flower_venv_path(lock)
    if (venv / ".complete").exists():
        return venv
    lock_file = venv.with_name(venv.name + ".lock")
    with lock_file.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return venv
        # Made where it lives (a venv's scripts name their interpreter by path); one left
        # half-made by a killed maker has no `.complete` and is made again.
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([*_venv_maker(), str(venv)], check=True, timeout=INSTALL_TIMEOUT_S)
        python = str(venv / "bin" / "python")
        subprocess.run(
            [*_installer(python), "--no-deps", "--require-hashes", "-r", str(lock)],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        (venv / ".complete").write_text(lock.read_text())
    return venv


def _uv() -> str | None:
    """The uv beside this interpreter (the test command installs it from its lock), if any."""
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.is_file() else None


def _venv_maker() -> list[str]:
    """The command that makes a virtualenv at the path it is given (uv's, else venv's)."""
    uv = _uv()
    return (
        [uv, "venv", "--quiet", "--python", sys.executable]
        if uv
        else [sys.executable, "-m", "venv"]
    )


def _installer(python: str) -> list[str]:
    """The command that installs into the venv of `python`: uv where the project's own venv
    has it (a fresh machine: about 8 s against pip's 24 s quiet, 60 s beside the other tests,
    each spent while the Flower tests wait on this venv), else that venv's pip; bytecode
    compiled at install either way, as pip does."""
    uv = _uv()
    if uv:
        return [uv, "pip", "install", "--quiet", "--python", python, "--compile-bytecode"]
    return [python, "-m", "pip", "install", "--quiet"]


def poll(what: str, predicate: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Call `predicate` until it returns something truthy; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# --- TLS and SuperNode identities -------------------------------------------------------


@dataclass(frozen=True)
class Tls:
    """A CA and the SuperLink's certificate (for 127.0.0.1 and localhost) it signed."""

    ca: Path
    cert: Path
    key: Path

    def context(self) -> ssl.SSLContext:
        """A client context trusting only this CA."""
        return ssl.create_default_context(cafile=str(self.ca))


def make_tls(
    folder: Path,
    common_name: str = "fl-dispatcher local CA",
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
) -> Tls:
    """A new CA and a server certificate it signs for `hosts` (the names or addresses its
    clients dial: compose.yml's SuperLink is dialled as `superlink`), written into `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([_alt_name(host) for host in hosts]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    tls = Tls(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    tls.ca.write_bytes(ca_cert.public_bytes(pem))
    tls.cert.write_bytes(cert.public_bytes(pem))
    tls.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return tls


def _alt_name(host: str) -> Any:
    """A subjectAltName entry: an IP address, else a DNS name."""
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_supernode_key(folder: Path, site: str) -> tuple[Path, bytes]:
    """An EC key pair for a SuperNode, as `ssh-keygen -t ecdsa -b 384` writes one: its
    private key file (what flower-supernode reads) and `<site>.pub` beside it (what `flwr
    supernode register` reads); returns the private key's path and the public key as PEM
    (what RegisterNode takes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / site
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    path.with_name(f"{site}.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n"
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return path, public


def register_supernode(address: str, ca: Path, name: str, public_key: bytes) -> None:
    """Register a SuperNode's public key under a name, as an operator does with
    `flwr supernode register` (a key already registered is left as it is)."""
    import httpx

    from app.adapters.flower.proto import control_pb2

    request = control_pb2.RegisterNodeRequest(public_key=public_key, name=name)
    answer = httpx.post(
        f"https://{address}/v1/control/register-node",
        content=request.SerializeToString(),
        headers={"content-type": "application/protobuf"},
        timeout=10,
        verify=ssl.create_default_context(cafile=str(ca)),
    )
    already = answer.status_code == 409 or b'"code":23' in answer.content
    if answer.status_code >= 400 and not already:
        raise RuntimeError(f"RegisterNode {name}: {answer.status_code} {answer.text}")


def flower_env(venv: Path, home: Path) -> dict[str, str]:
    """A Flower process's environment: flwr's venv first, its own FLWR_HOME, none of the
    service's code, settings or secrets (`child_environment`)."""
    env = child_environment()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["FLWR_HOME"] = str(home)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def processes_under(folder: Path) -> list[int]:
    """The processes whose FLWR_HOME is under `folder`: a federation's, its orphans too (a
    SuperNode that exits leaves its SuperExec and ClientApps running)."""
    import psutil

    found = []
    prefix = str(folder) + os.sep
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("FLWR_HOME", "").startswith(prefix):
                found.append(process.pid)
    return found


class LocalSuperNodes:
    """The sites of a local Flower net: a SuperNode per site, registered with the net's
    SuperLink by name and started from flwr's venv. They keep reconnecting while the
    SuperLink is away (scaled to zero), so they outlive its restarts."""

    def __init__(
        self, venv: Path, workspace: Path, *, address: str, ca: Path, sites: Sequence[str]
    ) -> None:
        self.venv = venv
        self.workspace = workspace
        self.address = address
        self.ca = ca
        self.sites = tuple(sites)
        self.keys = {site: make_supernode_key(workspace / "keys", site) for site in self.sites}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def register(self) -> None:
        """Register every site's key (the SuperLink runs)."""
        for site, (_path, public) in self.keys.items():
            register_supernode(self.address, self.ca, site, public)

    def start(self) -> None:
        """Start every site's SuperNode (one running is left as it is)."""
        for index, site in enumerate(self.sites, 1):
            running = self.processes.get(site)
            if running is not None and running.poll() is None:
                continue
            folder = self.workspace / site
            folder.mkdir(parents=True, exist_ok=True)
            command = [
                str(self.venv / "bin" / "flower-supernode"),
                "--root-certificates",
                str(self.ca),
                "--superlink",
                self.address,
                "--port",
                str(process_control.free_port()),
                "--auth-supernode-private-key",
                str(self.keys[site][0]),
                "--node-config",
                f"partition-id={index}",
            ]
            with (folder / "log.txt").open("ab") as log:
                self.processes[site] = subprocess.Popen(
                    command,
                    cwd=folder,
                    env=flower_env(self.venv, folder / "home"),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )

    def close(self) -> None:
        """Stop every SuperNode and what it started, orphans included."""
        for site in list(self.processes):
            with contextlib.suppress(Exception):
                process_control.terminate_tree(self.processes.pop(site).pid)
        for pid in processes_under(self.workspace):
            with contextlib.suppress(Exception):
                process_control.terminate_tree(pid, sig=signal.SIGKILL)


def local_flower_net(
    root: Path,
    venv: Path,
    *,
    name: str,
    idle_timeout_s: float,
    ready_timeout_s: float = 120,
    sites: Sequence[str] = SITES,
) -> tuple[dict[str, Any], LocalSuperNodes]:
    """A Flower net for a local stack whose workdir is `root` (its data folder
    `root/data`): its nets entry (the local driver's SuperLink, with TLS, SuperNode
    authentication and its state in a database, on a free port) and its SuperNodes,
    registered by site name and running. The caller closes the SuperNodes.

    What an operator does once: the SuperLink up (by the net's own driver, on its own state
    database), each SuperNode registered by its site name and started, the SuperLink down
    again. The SuperNodes keep running and reconnect whenever it is back."""
    import json

    from app.adapters.drivers import build_driver
    from app.adapters.flower.client import build_flower_client
    from app.errors import TransientError
    from app.settings import Settings

    workspace = root / "flower"
    tls = make_tls(workspace / "tls")
    address = f"127.0.0.1:{process_control.free_port()}"
    entry: dict[str, Any] = {
        "name": name,
        "backend": "flower",
        "idle_timeout_s": idle_timeout_s,
        "ready_timeout_s": ready_timeout_s,
        "required_sites": list(sites),
        "driver": {
            "kind": "local",
            "superlink_dir": str(workspace / "superlink"),
            "ssl_certfile": str(tls.cert),
            "ssl_keyfile": str(tls.key),
        },
        "flower": {"address": address, "root_certificates": str(tls.ca)},
    }
    nodes = LocalSuperNodes(venv, workspace, address=address, ca=tls.ca, sites=sites)
    settings = Settings(
        NETS=json.dumps([entry]), FLWR_VENV=str(venv), FL_DISPATCHER_DATA_DIR=str(root / "data")
    )
    net = settings.net(name)
    driver = build_driver(net, settings)

    def answers() -> bool:
        with build_flower_client(net, settings) as client:
            try:
                client.ping()
            except TransientError:
                return False
            return True

    def ready() -> bool:
        with build_flower_client(net, settings) as client:
            return client.is_ready(sites).ready

    driver.scale(1)
    try:
        poll("the SuperLink's Control API", answers, 60, 0.5)
        nodes.register()
        nodes.start()
        poll("the SuperNodes online", ready, NODES_TIMEOUT_S, 0.5)
    except BaseException:
        nodes.close()
        raise
    finally:
        driver.scale(0)
    return entry, nodes


# --- the tiny Flower App ---------------------------------------------------------------

# The demo's and the tests' Flower App (one): each round its ServerApp asks every SuperNode's
# ClientApp for a number and sums the answers; its run config can make a run last or fail,
# or check what the dispatcher put in the run config (app/local/flower_app/pyproject.toml).
APP = Path(__file__).resolve().parent / "flower_app"


def build_flower_app(target: Path, **config: object) -> Path:
    """Copy the tiny Flower App into `target` (a job folder under JOB_ROOT), with `config`'s
    values as its run config's defaults (keys as the app's pyproject.toml spells them)."""
    shutil.copytree(APP, target, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = target / "pyproject.toml"
    text = pyproject.read_text()
    for key, value in config.items():
        literal = str(value).lower() if isinstance(value, bool) else repr(value)
        text, count = re.subn(rf"(?m)^{re.escape(key)} = .*$", f"{key} = {literal}", text)
        if count != 1:
            raise ValueError(f"the tiny Flower App's run config has no {key!r}")
    pyproject.write_text(text)
    return target

"""A local NVFLARE deployment: provision it, start and stop its processes, build a tiny job.

Used by the local scale driver, the demo and the integration/e2e tests. Everything stays inside
the given workspace and on loopback: provisioning runs nvflare's own provisioner in-process
(no `nvflare poc`, so nothing is written under the real HOME), and the server's job store is
moved from nvflare's default `/tmp/nvflare` into the workspace so two deployments on one machine
never share state.

Processes are started without nvflare's watchdog (`sub_start.sh` restarts a dead process after
5 s; we want "stopped" to mean stopped): we run the exact python command line `sub_start.sh
--once` would exec, with this interpreter, each in its own session so that stopping the group
also stops the job processes the server or a site spawned.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LOOPBACK_HOST = "localhost"
# The server participant is named after the host the sites and admins dial, so the server's
# certificate CN, its identity in every kit and its target all read `localhost`.
SERVER_NAME = LOOPBACK_HOST
_ORG = "nvidia"
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
# `start_python() { exec python3 -u -m <module> -m "$WORKSPACE" -s <file> --set <args...> }`
_EXEC_LINE_RE = re.compile(r"^\s*exec python3 (?P<args>.+)$", re.MULTILINE)
_STOP_TIMEOUT_S = 15.0


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


@dataclass
class ProcessHandle:
    """One started NVFLARE participant process (the leader of its own process group)."""

    name: str
    kit: Path
    popen: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        """The participant's python process id (also its process group id)."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the participant process has not exited."""
        return self.popen.poll() is None


# Processes started with track=True are stopped at interpreter exit, so a failed test or an
# interrupted demo leaves no orphan. The local driver opts out: its server must outlive the
# worker that started it.
_tracked: dict[int, ProcessHandle] = {}
_tracked_lock = threading.Lock()


def _stop_tracked() -> None:
    with _tracked_lock:
        handles = list(_tracked.values())
    for handle in handles:
        with contextlib.suppress(Exception):
            kill(handle)


atexit.register(_stop_tracked)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on host:port right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port(host: str, port: int, timeout: float, *, interval: float = 0.05) -> None:
    """Poll until host:port accepts connections; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not port_open(host, port, timeout=min(0.5, timeout)):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{host}:{port} did not open within {timeout:.1f} s")
        time.sleep(interval)


def wait_port_closed(host: str, port: int, timeout: float, *, interval: float = 0.05) -> None:
    """Poll until host:port refuses connections; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while port_open(host, port, timeout=min(0.5, timeout)):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{host}:{port} still open after {timeout:.1f} s")
        time.sleep(interval)


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


def _project_dict(project: str, port: int, sites: Sequence[str], admin: str) -> dict[str, Any]:
    participants: list[dict[str, Any]] = [
        {
            "name": SERVER_NAME,
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
) -> Deployment:
    """Provision a server, `sites` and one project admin into `workspace/<project>/`.

    Each project gets its own root CA, so a second project is an unrelated deployment whose
    kits the first one's server rejects. The server's identity and every target read
    `localhost:<port>`; `port` defaults to a free one.
    """
    from nvflare.lighter.constants import CtxKey
    from nvflare.lighter.prov_utils import prepare_builders, prepare_packager
    from nvflare.lighter.provision import prepare_project
    from nvflare.lighter.provisioner import Provisioner

    workspace = workspace.resolve()
    chosen_port = port if port is not None else free_port()
    project_dict = _project_dict(project, chosen_port, tuple(sites), admin)
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
    server_kit = prod / SERVER_NAME
    _localize_server_storage(server_kit, workspace / project / "server-store")
    return Deployment(
        workspace=workspace,
        project=project,
        port=chosen_port,
        server_kit=server_kit,
        site_kits={site: prod / site for site in sites},
        admin_kit=prod / admin,
        admin_user=admin,
    )


# --- processes ------------------------------------------------------------------------------


def server_endpoint(server_kit: Path) -> tuple[str, int]:
    """(host, port) the server kit's `fed_server.json` serves on (its `service.target`)."""
    config = json.loads((server_kit / "startup" / "fed_server.json").read_text())
    target = str(config["servers"][0]["service"]["target"])
    host, _, port = target.rpartition(":")
    return host or LOOPBACK_HOST, int(port)


def kit_command(kit: Path) -> list[str]:
    """The command line `startup/sub_start.sh --once` would exec for this kit, with this python.

    Read from the kit itself so the arguments (`uid=`, `org=`, ...) are exactly the provisioned
    ones; `python3` on PATH may not be the interpreter that has nvflare installed.
    """
    kit = kit.resolve()
    script = (kit / "startup" / "sub_start.sh").read_text()
    match = _EXEC_LINE_RE.search(script)
    if match is None:
        raise ValueError(f"{kit}/startup/sub_start.sh has no 'exec python3 ...' line")
    args = shlex.split(match.group("args").replace('"$WORKSPACE"', shlex.quote(str(kit))))
    return [sys.executable, *args]


def _start(kit: Path, name: str, log_dir: Path | None, track: bool) -> ProcessHandle:
    kit = kit.resolve()
    log_dir = log_dir or kit.parent.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    command = kit_command(kit)
    (kit / "transfer").mkdir(exist_ok=True)  # sub_start.sh creates it before exec
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} start {name}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            command,
            cwd=kit,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Own session = own process group: stop() signals the job processes it spawns too,
            # and a Ctrl-C in the parent's terminal does not reach it.
            start_new_session=True,
        )
    handle = ProcessHandle(name=name, kit=kit, popen=popen, log_path=log_path)
    if track:
        with _tracked_lock:
            _tracked[handle.pid] = handle
    logger.info("started %s pid=%s (log %s)", name, handle.pid, log_path)
    return handle


def start_server(
    target: Deployment | Path,
    *,
    log_dir: Path | None = None,
    track: bool = True,
    name: str = "server",
) -> ProcessHandle:
    """Start the server from a deployment or a server kit folder; returns at once.

    The log goes to `log_dir/<name>.log` (default: the deployment's `logs/` folder).
    """
    kit = target.server_kit if isinstance(target, Deployment) else target
    return _start(kit, name, log_dir, track)


def start_site(site_kit: Path, *, log_dir: Path | None = None, track: bool = True) -> ProcessHandle:
    """Start one client site from its kit folder; it registers with the server by itself."""
    return _start(site_kit, site_kit.resolve().name, log_dir, track)


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def stop(
    handle: ProcessHandle, sig: int = signal.SIGTERM, timeout: float = _STOP_TIMEOUT_S
) -> int | None:
    """Stop the participant and every process it spawned (see `terminate_tree`).

    Returns the participant's exit code (None only if it could not be reaped).
    """
    terminate_tree(handle.pid, sig=sig, timeout=timeout, reap=lambda _pid: handle.popen.poll())
    try:
        code: int | None = handle.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    with _tracked_lock:
        _tracked.pop(handle.pid, None)
    return code


def kill(handle: ProcessHandle, timeout: float = _STOP_TIMEOUT_S) -> int | None:
    """SIGKILL the participant and everything it spawned: a crash, as when a container dies."""
    return stop(handle, signal.SIGKILL, timeout)


# --- /proc helpers (Linux) used to recognise a server across dispatcher restarts -------------


def _stat_fields(path: Path) -> list[str] | None:
    try:
        stat = path.read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses; the rest follows the last ')'.
    return stat[stat.rindex(")") + 2 :].split()


def proc_start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot, or None if there is no such live process.

    A zombie counts as dead (it holds no socket any more), but only once every thread is
    gone: when the main thread of a multi-threaded process exits first, /proc shows the
    process as a zombie while its other threads still run and still serve its port.
    """
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    if fields is None:
        return None
    if fields[0] in ("Z", "X"):
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            return None
        states = [f[0] for t in tasks if (f := _stat_fields(t / "stat")) is not None]
        if all(state in ("Z", "X") for state in states):
            return None
    return int(fields[19])  # field 22 overall: starttime


def proc_cmdline(pid: int) -> list[str] | None:
    """The process's argv, or None if it is gone or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def listener_pids(port: int) -> list[int]:
    """Pids of the processes listening on TCP `port` (from /proc/net; for error messages)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{inode}]")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
    return pids


def reap(pid: int) -> None:
    """Collect the exit status if `pid` is our exited child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def process_tree(pid: int) -> list[tuple[int, int]]:
    """(pid, start ticks) of every live descendant of `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[tuple[int, int]] = []
    pending = list(children.get(pid, []))
    while pending:
        child = pending.pop()
        ticks = proc_start_ticks(child)
        if ticks is not None:
            found.append((child, ticks))
        pending.extend(children.get(child, []))
    return found


def _signal_members(members: Sequence[tuple[int, int]], sig: int) -> None:
    for pid, ticks in members:
        if proc_start_ticks(pid) == ticks:  # never a process that merely reuses the pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _members_gone(
    members: Sequence[tuple[int, int]], timeout: float, reap_fn: Callable[[int], object]
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        for pid, _ticks in members:
            reap_fn(pid)
        if all(proc_start_ticks(pid) != ticks for pid, ticks in members):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def terminate_tree(
    pid: int,
    *,
    sig: int = signal.SIGTERM,
    timeout: float = _STOP_TIMEOUT_S,
    reap: Callable[[int], object] = reap,
    expected_ticks: int | None = None,
) -> None:
    """Stop a participant started in its own session, and the job processes it spawned.

    nvflare 2.9 starts each job process with `setsid` (utils/process_utils.py), so a job
    process is NOT in its parent's process group and survives a group kill, orphaned. The
    tree is therefore read from /proc while the parent still lives, every member is signalled
    (by pid AND start time, so a reused pid is never hit), and after the parent has exited
    its job processes get a short grace and then SIGKILL. With `expected_ticks`, nothing is
    signalled unless `pid` is still the process that started at that time.
    """
    ticks = proc_start_ticks(pid)
    if ticks is None or (expected_ticks is not None and ticks != expected_ticks):
        reap(pid)
        return
    leader = [(pid, ticks)]
    spawned = process_tree(pid)
    signal_group(pid, sig)
    _signal_members(spawned, sig)
    if not _members_gone(leader, timeout, reap):
        logger.warning("pid=%s ignored signal %s; killing", pid, sig)
        signal_group(pid, signal.SIGKILL)
        _members_gone(leader, timeout, reap)
    if not _members_gone(spawned, min(5.0, timeout), reap):
        _signal_members(spawned, signal.SIGKILL)
        _members_gone(spawned, timeout, reap)
    if proc_start_ticks(pid) is None:
        # Anything left in the leader's group; safe while no new process owns the pid.
        signal_group(pid, signal.SIGKILL)


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

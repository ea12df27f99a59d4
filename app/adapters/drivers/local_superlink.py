"""The `local` scale driver of a Flower net: its SuperLink as a local process, started from
the virtualenv FLWR_VENV names (flwr cannot share this service's: tests/README.md
"Dependencies") and stopped with the SuperExec and ServerApps it started.

Everything else is the NVFLARE local driver's (`local.py`): the intent and the process it
started recorded in `<state_dir>/<net>.json`, a process recognised by its start time and
command line (the `flower-superlink` script and this net's state database), one start at a
time under the net's lock. What a SuperLink needs that an fl-server kit carries:

- its state in a database (`<superlink_dir>/state.db`), not in memory: the SuperNodes
  registered by name (what readiness waits for) and the runs outlive a scale to zero, and a
  run the SuperLink was killed under reads finished:failed after the restart (LOST);
- TLS and SuperNode authentication: flwr allows authentication only with TLS, and without
  it a SuperNode has no name (`node-<id>`) a net's `required_sites` could name;
- no installation of an app's dependencies at run time (flwr's default, `uv sync`, would
  reach a package index from the server): a Flower App runs on what FLWR_VENV holds.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from app.adapters.child_env import child_environment
from app.adapters.drivers.local import LocalDriver
from app.adapters.nvflare.participants import ProcessHandle
from app.errors import DriverMisconfigured
from app.net_config import FlowerLocalDriverConfig, NetConfig
from app.settings import Settings

PROGRAM = "flower-superlink"
DATABASE = "state.db"


class SuperLinkDriver(LocalDriver):
    """Scales one Flower net's local SuperLink between 0 and 1 processes."""

    def __init__(
        self,
        net_name: str,
        config: FlowerLocalDriverConfig,
        *,
        address: str,
        root_certificates: Path,
        venv: Path | None,
        state_dir: Path,
    ) -> None:
        super().__init__(net_name, config.superlink_dir, state_dir)
        self.config = config
        self.address = address
        self.root_certificates = root_certificates
        self.venv = venv
        # The script's path is argv[1] of its interpreter: what names the program (without
        # FLWR_VENV nothing is ours, and a start says what is missing).
        self.program = str(venv / "bin" / PROGRAM) if venv is not None else PROGRAM
        self.database = self.server_kit_dir / DATABASE

    def _bin(self, name: str) -> Path:
        if self.venv is None:
            raise DriverMisconfigured(
                f"net {self.net_name}: FLWR_VENV is unset (the virtualenv holding flwr, "
                "from which the local driver starts a Flower net's SuperLink)"
            )
        return self.venv / "bin" / name

    def _identity(self) -> str:
        """The net's own state database, an argument of its SuperLink's command line."""
        return str(self.database)

    def _endpoint(self) -> tuple[str, int]:
        host, _, port = self.address.rpartition(":")
        return host, int(port)

    def command(self) -> list[str]:
        """The SuperLink's command line (see the module docstring for each choice)."""
        host, port = self._endpoint()
        return [
            self.program,
            "--ssl-certfile",
            str(self.config.ssl_certfile),
            "--ssl-keyfile",
            str(self.config.ssl_keyfile),
            "--ssl-ca-certfile",
            str(self.root_certificates),
            "--enable-supernode-auth",
            "--disable-runtime-dependency-installation",
            "--database",
            str(self.database),
            "--host",
            host,
            "--port",
            str(port),
        ]

    def _launch(self, env: dict[str, str]) -> ProcessHandle:
        if not self._bin(PROGRAM).is_file():
            raise DriverMisconfigured(
                f"net {self.net_name}: {self.program} is missing: FLWR_VENV={self.venv} "
                "holds no flwr"
            )
        folder = self.server_kit_dir
        logs = self.state_dir / "logs"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DriverMisconfigured(
                f"net {self.net_name}: cannot make {folder}: {exc.strerror}"
            ) from exc
        env = child_environment(env)  # none of the dispatcher's settings or secrets
        # It starts its SuperExec (and that the ServerApps) by name, from its own venv.
        env["PATH"] = f"{self._bin('')}{os.pathsep}{env.get('PATH', '')}"
        env["FLWR_HOME"] = str(folder / "home")
        env.pop("PYTHONPATH", None)  # the Flower side sees nothing of the service's code
        env.pop("VIRTUAL_ENV", None)
        log_path = logs / f"{self.net_name}.log"
        with log_path.open("ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} start SuperLink\n".encode())
            log.flush()
            popen = subprocess.Popen(
                self.command(),
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C in the parent's terminal does not reach it, and it
                # outlives the worker that started it.
                start_new_session=True,
            )
        return ProcessHandle(name=self.net_name, kit=folder, popen=popen, log_path=log_path)


def superlink_driver(
    net: NetConfig, config: FlowerLocalDriverConfig, settings: Settings
) -> SuperLinkDriver:
    """The local driver of a Flower net, from its validated config."""
    if net.flower is None or net.flower.root_certificates is None:  # NetConfig refuses both
        raise DriverMisconfigured(f"net {net.name}: a local SuperLink needs flower TLS settings")
    return SuperLinkDriver(
        net.name,
        config,
        address=net.flower.address,
        root_certificates=net.flower.root_certificates,
        venv=settings.flwr_venv,
        state_dir=settings.data_dir / "local-driver",
    )

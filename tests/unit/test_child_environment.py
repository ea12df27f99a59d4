"""A server a driver starts on this host gets none of the worker's secrets (review 22: the
local driver handed them to the server that runs job code; fixed by app/adapters/child_env.py).

Promises: CALLBACK_SECRET is "never logged or shown" (app/README.md "Configuration"; an
unsigned or guessable status push "would let anyone on the path forge a job's end",
settings.py); the servers run the jobs flip-api's users submit, and job code must reach
neither the job store nor the broker (compose.yml's networks; app/entrypoints/README.md
"Who reaches what"); docker-socket-proxy.haproxy.cfg: "keep secrets out of the fl-server
container's env". A process's settings come from its environment (app/settings.py), so a
worker's environment holds DATABASE_URL with its password, CALLBACK_SECRET and API_SECRET
(and AWS keys, left out here: a server may have a use for its own).

Scenario: a worker with those settings in its environment scales up a net on the `local`
driver (nets.local.toml, `local-net`; `demo` does the same with its run's CALLBACK_SECRET).
The server kit is a stand-in whose `startup/sub_start.sh` execs a Python one-liner (named as
the NVFLARE server module, as the driver checks) that writes the environment it was given
to a file: the environment NVFLARE's server, and the server-side job code it runs, get.

What happened: `participants.start_server` starts the server with `{**os.environ, **env}`,
the worker's whole environment, so every secret above is in the job code's `os.environ`
(the Flower SuperLink's local driver does the same: `dict(os.environ) | env`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from app.adapters.drivers.local import LocalDriver
from app.settings import Settings
from tests.unit.test_local_driver_start_window import free_port

SECRETS = {
    "CALLBACK_SECRET": "callback-secret-5d2a9f10b3",
    "API_SECRET": "api-secret-0e6c4b1f",
    "DATABASE_URL": "postgresql+psycopg://fl:pg-pass-77aa@postgres:5432/fl",
}
DUMP = (
    "import json, os, sys, time; "
    "open(sys.argv[-1], 'w').write(json.dumps(dict(os.environ))); time.sleep(60)"
)


def _kit(folder: Path, dump: Path) -> Path:
    startup = folder / "startup"
    startup.mkdir(parents=True)
    (startup / "fed_server.json").write_text(
        json.dumps({"servers": [{"service": {"target": f"localhost:{free_port()}"}}]})
    )
    (startup / "sub_start.sh").write_text(
        "#!/bin/sh\nstart_python() {\n"
        f'  exec python3 -c "{DUMP}" nvflare.private.fed.app.server.server_train '
        f'-m "$WORKSPACE" {dump}\n}}\n'
    )
    return folder


def test_a_local_server_gets_none_of_the_workers_secrets(tmp_path: Path, monkeypatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    dump = tmp_path / "server-environment.json"
    state_dir = tmp_path / "driver"
    driver = LocalDriver("local-net", _kit(tmp_path / "server", dump), state_dir)

    driver.scale(1)
    try:
        deadline = time.monotonic() + 15
        while not dump.exists() or not dump.read_text():
            assert time.monotonic() < deadline, "the stand-in server never started"
            time.sleep(0.05)
        environment = json.loads(dump.read_text())
    finally:
        recorded = json.loads((state_dir / "local-net.json").read_text())
        if recorded.get("pid"):
            os.killpg(int(recorded["pid"]), signal.SIGKILL)

    leaked = sorted(name for name, value in SECRETS.items() if value in environment.values())
    assert not leaked, f"the server (and its job code) was started with {leaked}"


def test_a_local_superlink_gets_none_of_the_workers_secrets_nor_its_cloud_credentials(
    tmp_path: Path, monkeypatch
) -> None:
    """The same for a Flower net's local SuperLink (`dict(os.environ) | env` before): its
    program, a stand-in in FLWR_VENV that writes the environment it was given, gets none of
    the worker's settings, Celery's or the stack's secrets, nor the worker's AWS keys; it
    keeps the rest (PATH, and what the driver sets: FLWR_HOME)."""
    from app.adapters.drivers.local_superlink import superlink_driver
    from app.net_config import parse_nets
    from tests.unit.test_flower_nets import flower_decl

    others = {
        "AWS_SECRET_ACCESS_KEY": "aws-secret-1f2e",
        "FLOWER_BASIC_AUTH": "admin:flower-pass-93",
        "CELERY_BROKER_URL": "redis://:celery-pass-41@redis:6379/0",
        "FL_DISPATCHER_ENV_FILE": "/etc/fl-dispatcher/secret.env",
    }
    for name, value in {**SECRETS, **others}.items():
        monkeypatch.setenv(name, value)
    dump = tmp_path / "superlink-environment.json"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    program = venv / "bin" / "flower-superlink"
    program.write_text(f"#!/bin/sh\nexec env -0 > {dump}\n")  # NUL-separated NAME=value
    program.chmod(0o755)
    (net,) = parse_nets([flower_decl(tmp_path, port=free_port())], "NETS")
    assert net.driver.kind == "local"
    settings = Settings(FLWR_VENV=venv, FL_DISPATCHER_DATA_DIR=tmp_path / "data")
    handle = superlink_driver(net, net.driver, settings)._launch({"FLWR_HOME": "set-here"})
    handle.popen.wait(timeout=15)
    pairs = (item.partition("=") for item in dump.read_text().split("\0") if item)
    environment = {name: value for name, _, value in pairs}

    leaked = sorted(
        name for name, value in {**SECRETS, **others}.items() if value in environment.values()
    )
    assert not leaked, f"the SuperLink (and the ServerApps it runs) was started with {leaked}"
    assert environment["PATH"].startswith(str(venv / "bin"))
    assert environment["FLWR_HOME"] != "set-here"  # the driver's own, after the extra

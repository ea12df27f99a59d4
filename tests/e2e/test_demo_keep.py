"""After `fl-dispatcher demo --keep` (issue 41): the folder it keeps, read with the settings
file it names, shows the demo's one net and two jobs at every door, the same at each: the
CLI's `status` and `jobs`, and the status API's /fl/status, nets page and /metrics (served by
`fl-dispatcher --env-file ... api`, as the demo's last lines say)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from app.process_control import free_port
from app.settings import ENV_FILE_VARIABLE, Settings

pytestmark = pytest.mark.e2e
EXPECTED_S = 130  # seconds on the 2-core CI machine (tests/tools/schedule.py)

CLI = [sys.executable, "-m", "app.entrypoints.cli"]
DEMO_S = 600


def clean_env() -> dict[str, str]:
    """A user's environment: no setting of its own (the demo and its file say everything)."""
    names = {f.alias for f in Settings.model_fields.values() if f.alias} | {ENV_FILE_VARIABLE}
    return {k: v for k, v in os.environ.items() if k not in names}


def cli(*argv: str, cwd: Path) -> str:
    done = subprocess.run(
        [*CLI, *argv], env=clean_env(), cwd=cwd, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def test_a_kept_demo_shows_its_net_and_jobs_at_every_door(tmp_path):
    demo = subprocess.run(
        [*CLI, "demo", "--keep", "--idle-gap", "0"],
        env=clean_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=DEMO_S,
        check=False,
    )
    first = re.match(r"fl-dispatcher demo in (\S+)\n", demo.stdout)
    assert first is not None, demo.stdout
    folder = Path(first.group(1))
    api: subprocess.Popen[bytes] | None = None
    try:
        assert demo.returncode == 0, (demo.stdout[-3000:], demo.stderr[-3000:])
        env_file = folder / "fl-dispatcher.env"
        # It ends by saying how to look, with the very commands run below.
        for line in ("status", "jobs", "api --port 8080"):
            assert f"  fl-dispatcher --env-file {env_file} {line}" in demo.stdout
        assert "fl-dispatcher local-net DIR" in demo.stdout
        assert "CALLBACK" not in env_file.read_text()  # its receiver ended with the run

        status = json.loads(cli("--env-file", str(env_file), "status", "--json", cwd=tmp_path))
        jobs = json.loads(cli("--env-file", str(env_file), "jobs", "--json", cwd=tmp_path))
        assert [n["name"] for n in status["nets"]] == ["local-net"]
        assert status["nets"][0]["state"] == "STOPPED"  # scaled to zero after the second job
        keys = sorted(j["caller_key"] for j in jobs)
        assert len(keys) == 2 and all(k.startswith("demo-") for k in keys)
        assert {(j["state"], j["net"], j["attempt"]) for j in jobs} == {
            ("COMPLETED", "local-net", 1)
        }
        assert list(tmp_path.iterdir()) == []  # read with its settings: nothing made here

        port = free_port()
        api = subprocess.Popen(
            [*CLI, "--env-file", str(env_file), "api", "--port", str(port)],
            env=clean_env(),
            cwd=tmp_path,
            stdout=(folder / "api.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                fl_status = json.loads(get(f"{base}/fl/status"))
                break
            except OSError:
                assert api.poll() is None, (folder / "api.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the api did not answer"
                time.sleep(0.5)
        assert [(n["name"], n["state"]) for n in fl_status["nets"]] == [("local-net", "STOPPED")]
        page = get(f"{base}/nets")
        assert "<b>1 nets</b>" in page and "local-net" in page
        assert all(key in page for key in keys)
        metrics = get(f"{base}/metrics")
        assert 'net="local-net"' in metrics
        listed = json.loads(get(f"{base}/jobs"))["jobs"]
        assert sorted(j["caller_key"] for j in listed) == keys
    finally:
        if api is not None and api.poll() is None:
            os.killpg(api.pid, signal.SIGTERM)
            api.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)

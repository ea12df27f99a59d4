"""A script driving Celery's own worker-side objects (a `Request` on a real message) in a
process of its own, so its broker and settings come from the environment as a worker's do:
what the lost-delivery tests (`test_lost_delivery*.py`) share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_script(
    script: str,
    args: list[str],
    tmp_path: Path,
    *,
    broker_url: str = "memory://",
    backoff_max_s: int = 60,
    env_extra: dict[str, str] | None = None,
) -> Any:
    """Run `script` with `args` on `broker_url` and no nets; the JSON its last line prints."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("NETS", "DATABASE_URL"))},
        "PYTHONPATH": str(ROOT),
        "BROKER_URL": broker_url,
        "FL_DISPATCHER_DATA_DIR": str(tmp_path / "data"),
        "RETRY_BACKOFF_MAX_S": str(backoff_max_s),
        "NETS": "[]",
        **(env_extra or {}),
    }
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])

"""Review 22: a broker password on a process's command line.

Promise (compose.yml, the `flower` service; tests/unit/test_compose.py
`test_no_secret_on_a_command_line`): the broker URL and its credentials come from a
process's environment, "never from its command line, which `ps` on the host shows to
anyone". BROKER_URL is one of the secrets that test keeps off the services' commands, and
beside FLIP it names FLIP's Redis, whose password (an ElastiCache AUTH token,
`rediss://:token@...`) is in it.

Scenario: the `worker` and `housekeeper` healthchecks, run by the engine every 30 s, with
BROKER_URL=redis://:<password>@flip-redis:6379/5 in the container's environment (compose.env's
FLIP example, with a password). Each runs the shell line compose.yml gives it, with a
stand-in `celery` first on PATH that records the arguments it was started with (what
/proc/<pid>/cmdline, and so `ps`, shows while the real one waits up to 5 s for the pings).

What happened: the shell expands `--broker="$BROKER_URL"` into celery's argv, so the
password is on the command line of a process in the container (visible from the host) for
every healthcheck; Celery reads CELERY_BROKER_URL from its environment as well.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "redis-auth-token-7c1d0e"
BROKER_URL = f"redis://:{PASSWORD}@flip-redis:6379/5"


def _healthcheck_shell(service: str) -> str:
    """The service's CMD-SHELL healthcheck as the container's shell runs it (`$$` is
    compose's escape for `$`)."""
    compose = yaml.safe_load((ROOT / "compose.yml").read_text())
    test = compose["services"][service]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL", test
    return str(test[1]).replace("$$", "$")


@pytest.mark.parametrize("service", ["worker", "housekeeper"])
def test_the_worker_healthcheck_puts_no_broker_password_on_a_command_line(
    service: str, tmp_path: Path
) -> None:
    """See the module docstring: the arguments `celery` is started with hold no password."""
    recorded = tmp_path / "argv"
    fake = tmp_path / "bin" / "celery"
    fake.parent.mkdir()
    # Records its arguments as the kernel holds them, then answers as a worker would.
    fake.write_text(
        '#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >> "$RECORDED"\n'
        'printf "%s" "$CELERY_BROKER_URL" > "$RECORDED.broker"\n'
        'echo "-> fl-dispatcher-abc123@$HOSTNAME: OK"\n'
    )
    fake.chmod(0o755)
    env = {
        "PATH": f"{fake.parent}:{os.environ['PATH']}",
        "BROKER_URL": BROKER_URL,
        "HOSTNAME": "c0ffee",
        "RECORDED": str(recorded),
    }

    done = subprocess.run(
        ["/bin/sh", "-c", _healthcheck_shell(service)], env=env, check=False, timeout=30
    )

    assert done.returncode == 0, "the stand-in worker answered: the check must pass"
    argv = recorded.read_text()
    assert PASSWORD not in argv, f"celery's command line holds the broker password: {argv!r}"
    # ... and the broker is still the one celery reads (its environment).
    assert Path(f"{recorded}.broker").read_text() == BROKER_URL

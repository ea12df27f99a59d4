"""The environment of a server process a driver starts on this host (the local drivers'
NVFLARE server and Flower SuperLink, and the participants the demo starts): the worker's own,
less everything that is the dispatcher's. Those servers run the code flip-api's users
submit; a worker's environment holds its settings (DATABASE_URL with its password, the
broker's, CALLBACK_SECRET, API_SECRET) and the cloud credentials it scales nets with, and
none of it is theirs to read."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache

from app.settings import Settings

# Not settings of this process, but secrets an operator's environment hands the stack: the
# Celery Flower login, the database user's password (compose's), and boto3's credentials
# (the worker's, for ECS and S3: a server started here has no use for them).
_THE_STACKS = frozenset(
    {
        "FLOWER_BASIC_AUTH",
        "POSTGRES_PASSWORD",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
    }
)
# Whatever else names the dispatcher or Celery's own configuration (the env file's name,
# CELERY_BROKER_URL and its kind).
_PREFIXES = ("FL_DISPATCHER_", "CELERY_")


@cache
def _settings_names() -> frozenset[str]:
    return frozenset(
        field.alias for field in Settings.model_fields.values() if field.alias is not None
    )


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the dispatcher's settings, secrets and cloud
    credentials, then `extra` (what the driver sets for the server itself)."""
    own = _settings_names() | _THE_STACKS
    env = {
        name: value
        for name, value in os.environ.items()
        if name.upper() not in own and not name.upper().startswith(_PREFIXES)
    }
    return env | dict(extra or {})

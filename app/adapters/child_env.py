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
# Celery Flower login and the database user's password (compose's).
_THE_STACKS = frozenset({"FLOWER_BASIC_AUTH", "POSTGRES_PASSWORD"})
# Whatever else names the dispatcher or Celery's own configuration (the env file's name,
# CELERY_BROKER_URL and its kind); the worker's cloud identity, whatever form boto3 finds it
# in (keys, a profile, an ECS task role's or EKS IRSA's credential pointers and tokens: a
# server started here has no use for the worker's role); libpq's own connection settings
# (PGPASSWORD for a DATABASE_URL without a password); OpenTelemetry's exporter settings
# (OTEL_EXPORTER_OTLP_HEADERS carries the traces' credentials).
_PREFIXES = ("FL_DISPATCHER_", "CELERY_", "AWS_", "PG", "OTEL_")


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

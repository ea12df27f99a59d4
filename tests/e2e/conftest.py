"""The stack behind tests/e2e/test_flip_client.py, kept here so that test module imports
nothing of the project: it sees the dispatcher only as flip-api does (a broker, an HTTP API,
callbacks to its own endpoint, and the contract `fl-dispatcher schema` prints)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.local.stack import LocalStack, StackOptions
from app.process_control import free_port
from tests.fixtures.services import PrivateRedis

CONTRACT_API_KEY = "flip-client-api-key-0123456789"


@dataclass(frozen=True)
class ClientStack:
    """What flip-api is configured with: the broker, the API's URL and key."""

    broker_url: str
    api_url: str
    api_key: str
    stack: LocalStack


@pytest.fixture(scope="module")
def client_stack_factory(tmp_path_factory):
    """Starts a whole local stack (NVFLARE server and two sites, worker with beat, the status
    API) that posts its callbacks to `callback_url` signed with `secret`."""
    started: list[tuple[LocalStack, PrivateRedis]] = []

    def start(callback_url: str, secret: str) -> ClientStack:
        redis = PrivateRedis(tmp_path_factory.mktemp("redis"))
        redis.start()
        api_port = free_port()
        options = StackOptions(
            workdir=tmp_path_factory.mktemp("flipclient"),
            broker_url=redis.url(),
            idle_timeout_s=3.0,
            housekeeping_interval_s=1.0,
            api_port=api_port,
            extra_env={
                "RELEASE_AFTER": "reported",
                "CALLBACK_URL": callback_url,
                "CALLBACK_SECRET": secret,
                "CALLBACK_MAX_BACKOFF_S": "2",
                "API_SECRET": CONTRACT_API_KEY,
            },
        )
        stack = LocalStack(options)
        started.append((stack, redis))
        stack.start()
        return ClientStack(redis.url(), f"http://127.0.0.1:{api_port}", CONTRACT_API_KEY, stack)

    yield start
    for stack, redis in started:
        stack.close()
        redis.stop()

"""How the real client reads the server's refusal of an abort ("Job ... is not running.").

That NVFLARE 2.9 gives this answer for a run killed with an earlier server process (whose
record reads RUNNING for ever) is pinned on a real server, SIGKILLed and restarted, in
tests/integration/test_nvflare_admin.py. What cannot be produced there on demand is the
status read that follows the refusal failing; these cases check the client keeps the
server's answer then."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.adapters.backend import AbortOutcome
from app.adapters.nvflare.client import NvflareAdminClient
from app.errors import NvflareJobNotRunning, ServerUnavailable, UnknownAdminError

pytestmark = pytest.mark.unit


def _client(monkeypatch: pytest.MonkeyPatch, statuses: list[object]) -> NvflareAdminClient:
    client = NvflareAdminClient(
        net_name="net-a",
        kit_dir=Path("/nonexistent"),
        username="admin@example.org",
        login_timeout_s=1,
        command_timeout_s=1,
        login_max_tries=1,
        misconfigured_after_s=60,
    )

    def raw_status(_job: str) -> str:
        answer = statuses.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    def refused(_operation: object) -> object:
        raise NvflareJobNotRunning("Job nv-1 is not running.")

    monkeypatch.setattr(client, "_raw_status", raw_status)
    monkeypatch.setattr(client, "_run", refused)
    return client


@pytest.mark.parametrize(
    "after",
    ["RUNNING", UnknownAdminError("no status"), ServerUnavailable("blip")],
    ids=["reads-running", "no-status", "unreachable"],
)
def test_a_refusal_as_not_running_is_not_running_whatever_the_status_read_after_it(
    monkeypatch: pytest.MonkeyPatch, after: object
) -> None:
    client = _client(monkeypatch, ["RUNNING", after])
    assert client.abort("nv-1").outcome is AbortOutcome.NOT_RUNNING


def test_a_run_that_finished_between_the_status_read_and_the_abort_is_already_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = _client(monkeypatch, ["RUNNING", "FINISHED:COMPLETED"])
    result = client.abort("nv-1")
    assert result.outcome is AbortOutcome.ALREADY_FINISHED
    assert result.detail == "FINISHED:COMPLETED"

"""An nvflare failure turned into an app error reads "[context: ]category: type: message",
with the context prefix only when the caller gave one (net 'x', the operation)."""

from __future__ import annotations

from nvflare.fuel.flare_api import api_spec as nv

from app.adapters.nvflare.classify import classified_error


def test_without_a_context_the_message_starts_with_the_category() -> None:
    assert str(classified_error(nv.NoReply("timeout"))) == "server_unavailable: NoReply: timeout"


def test_with_a_context_the_message_starts_with_it() -> None:
    error = classified_error(nv.JobNotFound("no such job: abc"), "net-a: job_status")
    assert str(error) == "net-a: job_status: job_not_found: JobNotFound: no such job: abc"

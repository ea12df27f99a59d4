"""A refusal quotes an `s3://` definition and a metadata key as every other caller's value:
at most 80 characters, escaped, never whole (app/entrypoints/api_errors.py); and
`api --host-of` never resolves to listening on every address."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.adapters.s3_definition import parse_s3_definition
from app.entrypoints.listen_address import ListenAddressError, own_address_of
from app.errors import InvalidRequest
from app.schemas import EnqueueJob

MARKUP = "<img src=x onerror=alert(1)>" + "a" * 300


def test_an_s3_definition_is_quoted_short_and_escaped():
    with pytest.raises(InvalidRequest) as refused:
        parse_s3_definition("s3://" + MARKUP)
    assert "<img" not in str(refused.value) and "a" * 100 not in str(refused.value)


def test_a_metadata_key_is_quoted_short_and_escaped():
    payload = {
        "caller_key": "k-1",
        "definition": "job",
        "required_sites": ["site-1"],
        "metadata": {MARKUP: float("nan")},
    }
    with pytest.raises(ValidationError) as refused:
        EnqueueJob.model_validate(payload)
    assert "<img" not in str(refused.value) and "a" * 100 not in str(refused.value)


@pytest.mark.parametrize("name", ["0.0.0.0", "::"])
def test_host_of_an_unspecified_address_is_refused(name):
    with pytest.raises(ListenAddressError):
        own_address_of(name)

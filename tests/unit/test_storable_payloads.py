"""What flip-api sends must be storable and sendable: a string PostgreSQL or a JSON receiver
cannot hold (a NUL, a lone surrogate) is refused at the door in every field, as is a number
JSON has no word for (NaN, Infinity); valid Unicode is kept as it is; and a refusal whose own
words cannot be stored is recorded escaped, within its column."""

from __future__ import annotations

import math
import uuid

import pytest
from pydantic import ValidationError

from app.schemas import AbortJob, EnqueueJob, ReportedStatus, ReportJobStatus
from app.usecases import intake
from models import RejectedRequest

HOSTILE = ["\ud800", "a\x00b", "\udfff tail"]
# pydantic itself refuses a lone surrogate in a plain string field (string_unicode).
UNSTORABLE = r"cannot be stored|as a unicode string"


@pytest.mark.parametrize("text", HOSTILE)
def test_enqueue_refuses_a_string_that_cannot_be_stored_or_sent(text):
    base = {"caller_key": "k", "definition": "tiny-job"}
    for payload in (
        base | {"metadata": {"model": text}},
        base | {"metadata": {text: 1}},
        base | {"metadata": {"nested": [{"deep": text}]}},
        base | {"definition": f"tiny{text}"},
        base | {"required_sites": [f"site{text}"]},
    ):
        with pytest.raises(ValidationError, match=UNSTORABLE):
            EnqueueJob.model_validate(payload)
    with pytest.raises(ValidationError, match=UNSTORABLE):
        ReportJobStatus(job_id=uuid.uuid4(), status=ReportedStatus.ERROR, detail=text)
    with pytest.raises(ValidationError, match=UNSTORABLE):
        AbortJob(job_id=uuid.uuid4(), reason=text)


def test_unicode_that_is_valid_is_accepted_as_is():
    text = "Hôpital 病院 🏥 \u200d\ufeff"
    job = EnqueueJob(caller_key="k", definition="tiny-job", metadata={text: [text]})
    assert job.metadata == {text: [text]}


def test_a_rejection_with_an_unstorable_caller_key_is_recorded(world):
    intake.record_refusal(world.rt, "bad\x00key\ud800", "caller_key: invalid")
    with world.rt.sessions() as session:
        rows = session.query(RejectedRequest).all()
    assert [(r.caller_key, r.job_id) for r in rows] == [("bad\\x00key\\ud800", None)]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_enqueue_refuses_metadata_postgresql_cannot_store(value):
    """flip-api's JSON (Python's json, kombu's serializer) carries NaN and Infinity, and the
    payload check accepts them (it checks strings only). PostgreSQL's json type refuses them
    ('invalid input syntax for type json'), so on PostgreSQL the enqueue dies with a
    DataError that is not an InvalidRequest: no job, no rejection record, no `rejected`
    event: the request is lost without a trace. The callbacks of such a job also carry a
    body that is not JSON (`NaN`).

    Breaks: the commit's item 5 "every ... payload must be storable" and "A refused payload
    ... is recorded" (Task API); "refuse valid input / accept input that later crashes"."""
    with pytest.raises(ValidationError):
        EnqueueJob.model_validate(
            {"caller_key": "k", "definition": "tiny-job", "metadata": {"score": value}}
        )


def test_a_refused_caller_key_is_recorded_within_its_column(world):
    """The enqueue task cuts a refused payload's caller_key to 200 characters (the column's
    length, String(200)), then `record_rejection` escapes it (each NUL becomes 4 characters,
    each lone surrogate 6): up to 1200 characters go into a 200-character column. PostgreSQL
    refuses that ('value too long for type character varying(200)'), so the refusal is lost
    again: the exact DataError round 3 says it fixed.

    Breaks: the commit's item 5 "A refused enqueue whose own words cannot be stored is
    recorded escaped" and the Task API's "A refused payload ... is recorded"."""
    from app.usecases.intake import caller_key_of as _caller_key

    key = _caller_key({"caller_key": "\x00" * 300})
    intake.record_refusal(world.rt, key, "caller_key: invalid")
    limit = RejectedRequest.__table__.c.caller_key.type.length
    with world.rt.sessions() as session:
        stored = [r.caller_key for r in session.query(RejectedRequest).all()]
    assert len(stored) == 1
    assert stored[0] is not None and len(stored[0]) <= limit, len(stored[0] or "")

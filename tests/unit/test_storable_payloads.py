"""What flip-api sends must be storable and sendable: a string PostgreSQL or a JSON receiver
cannot hold (a NUL, a lone surrogate) is refused at the door in every field, as is a number
JSON has no word for (NaN, Infinity); valid Unicode is kept as it is; and a refusal whose own
words cannot be stored is recorded escaped, within its column."""

from __future__ import annotations

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
    intake.reject_enqueue(world.rt, "bad\x00key\ud800", "caller_key: invalid")
    with world.rt.sessions() as session:
        rows = session.query(RejectedRequest).all()
    assert [(r.caller_key, r.job_id) for r in rows] == [("bad\\x00key\\ud800", None)]

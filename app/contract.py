"""The public contract with flip-api in one document, generated from the code that
implements it (`fl-dispatcher schema` prints it; tests validate real payloads against it):

- the task payloads (app.schemas), the queue and task names;
- the status callback payloads, one schema per `kind`;
- the reason codes with flip-api's statuses for each (models.reasons.REASONS);
- how a job id is computed from a caller_key (app.schemas.job_id_for);
- the callback signature scheme (app.adapters.callbacks).

The callback payloads are the read models `app.usecases.callbacks.payloads` builds and
`app.usecases.callbacks` sends (`app.read_models.StateChangeEvent`, `RejectedEvent`): the
schema here is generated from the very models the payloads are.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app import names
from app.adapters import callbacks as signing
from app.read_models import ReadModel, RejectedEvent, StateChangeEvent
from app.schemas import JOB_ID_NAMESPACE, JSON_SCHEMA_DIALECT, job_id_for, payload_schemas
from models import REASONS

EXAMPLE_CALLER_KEY = "flip-model-42"


CALLBACK_EVENTS: dict[str, type[ReadModel]] = {
    "state_change": StateChangeEvent,
    "rejected": RejectedEvent,
}


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return {"$schema": JSON_SCHEMA_DIALECT, **model.model_json_schema()}


def reason_codes() -> dict[str, Any]:
    """Every reason code: what it means, and flip-api's statuses for each state it may end
    a job in (`rejected`: a refused request, no job)."""
    return {
        code.value: {
            "meaning": reason.meaning,
            "flip": {
                (state.value if state is not None else "rejected"): {
                    "model_status": status.model_status,
                    "job_status": status.job_status,
                }
                for state, status in reason.flip.items()
            },
        }
        for code, reason in REASONS.items()
    }


def signature_scheme() -> dict[str, Any]:
    """How a receiver verifies a callback (Standard Webhooks, v1)."""
    return {
        "standard": "Standard Webhooks (https://www.standardwebhooks.com), signature v1",
        "headers": {
            signing.WEBHOOK_ID_HEADER: "the event_id (signed)",
            signing.WEBHOOK_TIMESTAMP_HEADER: "Unix seconds when this try was sent",
            signing.WEBHOOK_SIGNATURE_HEADER: "v1,<base64 HMAC-SHA256(key, "
            '"<webhook-id>.<webhook-timestamp>.<raw body>")>, one per key, space-separated '
            "(CALLBACK_SECRET's first): a request is genuine when any of them matches",
        },
        "key": "CALLBACK_SECRET 'whsec_<base64>': the decoded bytes; any other "
        "CALLBACK_SECRET: its UTF-8 bytes (give a Standard Webhooks library "
        "'whsec_' + base64(CALLBACK_SECRET)); while CALLBACK_PREVIOUS_SECRET is set (a "
        "rotation), it is a second key, taken the same way",
        "body": "compact JSON, sorted keys, UTF-8; verify the raw bytes before parsing",
        "tolerance_s": signing.DEFAULT_TOLERANCE_S,
        "deprecated_headers": {
            signing.TIMESTAMP_HEADER: "Unix seconds",
            signing.SIGNATURE_HEADER: "sha256=<hex HMAC-SHA256(CALLBACK_SECRET as UTF-8, "
            '"<timestamp>.<raw body>")>',
            signing.EVENT_ID_HEADER: "the event_id",
            "until": "the next release; switch to the webhook-* headers",
        },
    }


def contract_document() -> dict[str, Any]:
    """The whole public contract, as `fl-dispatcher schema` prints it."""
    return {
        "title": "fl-dispatcher public contract",
        "queue": names.QUEUE,
        "tasks": payload_schemas(),
        "job_id": {
            "namespace": str(JOB_ID_NAMESPACE),
            "rule": "job_id = uuid5(namespace, caller_key) (RFC 4122 name-based, SHA-1; "
            "Python: uuid.uuid5(uuid.UUID(namespace), caller_key))",
            "example": {
                "caller_key": EXAMPLE_CALLER_KEY,
                "job_id": str(job_id_for(EXAMPLE_CALLER_KEY)),
            },
        },
        "callbacks": {kind: _schema(model) for kind, model in CALLBACK_EVENTS.items()},
        "reason_codes": reason_codes(),
        "signature": signature_scheme(),
    }


def reason_table_markdown() -> str:
    """tasks/README.md's reason-code table, generated from REASONS (a test keeps them equal)."""
    lines = [
        "| `reason_code` | Ends a job in | FLIP model status | FLIP job status | Meaning |",
        "|---|---|---|---|---|",
    ]
    for code, reason in REASONS.items():
        for state, status in reason.flip.items():
            lines.append(
                f"| `{code.value}` | {state.value if state else '(no job: `rejected` event)'} "
                f"| {status.model_status or 'unchanged'} | {status.job_status or 'unchanged'} "
                f"| {reason.meaning} |"
            )
    return "\n".join(lines)

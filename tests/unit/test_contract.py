"""`fl-dispatcher schema` is the public contract, generated from the code: real payloads
(tasks as the client sends them, every callback a job's life and a refusal produce, the
job-id rule) validate against what it prints, and tasks/README.md's reason-code table is the
code's table (its event-to-FLIP row leaving a job's status alone on a caller_key_conflict)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError
from sqlalchemy import select

from app.contract import reason_table_markdown
from app.entrypoints.cli import main
from app.errors import CallerKeyConflict
from app.schemas import (
    AbortJob,
    EnqueueJob,
    PrewarmNet,
    ReportedStatus,
    ReportJobStatus,
    job_id_for,
)
from app.usecases import intake, monitor
from app.usecases.callbacks.payloads import event_payload, rejection_payload
from models import REASONS, Job, JobEvent, RejectedRequest

README = Path(__file__).resolve().parents[2] / "tasks" / "README.md"  # "Reason codes"


@pytest.fixture
def contract(capsys) -> dict:
    assert main(["schema"]) == 0
    return json.loads(capsys.readouterr().out)


def _valid(schema: dict, payload: dict) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(
        payload,
        schema,
        cls=jsonschema.Draft202012Validator,
        format_checker=jsonschema.FormatChecker(),
    )


def test_the_task_payloads_the_client_sends_validate(contract):
    job_id = job_id_for("flip-model-42")
    sent = {
        "fl_dispatcher.enqueue_job": EnqueueJob(
            caller_key="flip-model-42", definition="fedavg", metadata={"model_id": "m-42"}
        ),
        "fl_dispatcher.abort_job": AbortJob(job_id=job_id),
        "fl_dispatcher.report_job_status": ReportJobStatus(
            job_id=job_id, status=ReportedStatus.RESULTS_UPLOADED
        ),
    }
    for task, payload in sent.items():
        _valid(contract["tasks"][task], payload.model_dump(mode="json"))
    # Field descriptions travel with the schema, for every field of every payload.
    for task, schema in [*contract["tasks"].items(), *contract["callbacks"].items()]:
        assert schema["description"], task
        for name, field in schema["properties"].items():
            assert field.get("description"), (task, name)
    assert contract["queue"] == "fl_dispatcher"


def test_the_job_id_rule_computes_the_ids_the_dispatcher_uses(contract):
    rule = contract["job_id"]
    namespace = uuid.UUID(rule["namespace"])
    for key in ("flip-model-42", "a/b:c@d", rule["example"]["caller_key"]):
        assert uuid.uuid5(namespace, key) == job_id_for(key)
    assert rule["example"]["job_id"] == str(job_id_for(rule["example"]["caller_key"]))


def test_every_callback_a_life_and_the_refusals_produce_validates(contract, world):
    done = world.enqueue("to-the-end", net="net-a", metadata={"model_id": "m-1"})
    world.run_pipeline(done)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    aborted = world.enqueue("aborted", net="net-a")
    world.abort(aborted)
    intake.record_refusal(world.rt, "bad", "unknown net 'x'")
    with pytest.raises(CallerKeyConflict) as conflict:
        intake.submit_job(
            world.rt, EnqueueJob(caller_key="aborted", definition="tiny-job", priority=3)
        )
    sent = {"caller_key": "aborted", "definition": "tiny-job", "priority": 3}
    intake.refuse_enqueue(world.rt, sent, conflict.value)
    with world.rt.sessions() as session:
        payloads = [
            event_payload(session.get(Job, e.job_id), e).model_dump(mode="json")
            for e in session.scalars(select(JobEvent).order_by(JobEvent.id))
        ] + [
            rejection_payload(r).model_dump(mode="json")
            for r in session.scalars(select(RejectedRequest))
        ]
    kinds = {p["kind"] for p in payloads}
    codes = {p["reason_code"] for p in payloads}
    assert kinds == {"state_change", "rejected"}
    assert codes >= {None, "run_completed", "aborted", "rejected", "caller_key_conflict"}
    for payload in payloads:
        _valid(contract["callbacks"][payload["kind"]], json.loads(json.dumps(payload)))


def test_a_payload_the_contract_does_not_allow_is_refused(contract):
    schema = contract["callbacks"]["state_change"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"kind": "state_change", "event_id": "1"}, schema)


def test_the_contract_refuses_a_state_change_whose_attempt_is_0(contract):
    """Attempts count from 1 since 0.2.0: a receiver validating against the contract tells
    a 0.1.0 payload (0-based) from a current one."""
    schema = contract["callbacks"]["state_change"]
    payload = {
        "attempt": 0,
        "at": "2026-11-29T12:00:05+00:00",
        "caller_key": "flip-model-42",
        "event_id": 1234,
        "from_state": "ASSIGNED",
        "job_id": "6f1c0c1e-0000-5000-8000-000000000000",
        "kind": "state_change",
        "metadata": {},
        "nvflare_job_id": None,
        "reason": "submitting",
        "reason_code": None,
        "to_state": "DISPATCHING",
    }
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(payload | {"attempt": 1})  # the payload is otherwise valid
    assert not validator.is_valid(payload)


@pytest.mark.parametrize(
    ("task", "model", "payload"),
    [
        ("fl_dispatcher.enqueue_job", EnqueueJob, {"priority": True}),
        ("fl_dispatcher.enqueue_job", EnqueueJob, {"priority": "3"}),
        ("fl_dispatcher.enqueue_job", EnqueueJob, {"max_attempts": True}),
        ("fl_dispatcher.prewarm", PrewarmNet, {"within_s": True}),
        ("fl_dispatcher.prewarm", PrewarmNet, {"within_s": "30"}),
    ],
)
def test_a_bool_or_a_string_for_a_number_is_refused_as_the_schema_says(
    contract, task, model, payload
):
    """The printed schema says number; the worker must not read True as 1 or "30" as 30."""
    base = {"caller_key": "k", "definition": "d"} if model is EnqueueJob else {"caller_key": "k"}
    if model is PrewarmNet:
        base["within_s"] = 60
    request = base | payload
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(request, contract["tasks"][task])
    with pytest.raises(ValidationError):
        model.model_validate(request)
    model.model_validate(base)  # the same payload with a number is taken


# The smallest payload each task takes; every field the walk below tries is added to it.
MINIMAL_PAYLOADS = {
    "fl_dispatcher.enqueue_job": {"caller_key": "k", "definition": "d"},
    "fl_dispatcher.abort_job": {"job_id": str(job_id_for("k"))},
    "fl_dispatcher.report_job_status": {"job_id": str(job_id_for("k")), "status": "error"},
    "fl_dispatcher.prewarm": {"caller_key": "k", "within_s": 60},
    "fl_dispatcher.cancel_prewarm": {"caller_key": "k"},
}


def _branches(field: dict) -> dict[str, dict]:
    """A field's schema by JSON type (one, or each of its anyOf)."""
    return {b["type"]: b for b in field.get("anyOf", [field]) if "type" in b}


def test_every_number_field_takes_what_the_schema_calls_a_number_and_only_that(contract):
    """JSON Schema's integer includes 5.0 (what many JSON encoders send for 5): every
    integer field of every payload takes it as 5 and refuses 5.5, as the schema does; every
    number field takes an integer. Walks the printed schemas, so a new field is covered."""
    from app.entrypoints.api import AbortBody
    from app.schemas import PUBLIC_PAYLOADS

    tried = []
    bodies = [
        (t, PUBLIC_PAYLOADS[t], MINIMAL_PAYLOADS[t], contract["tasks"][t]) for t in MINIMAL_PAYLOADS
    ]
    bodies.append(("POST /jobs/{id}/abort", AbortBody, {}, AbortBody.model_json_schema()))
    assert set(contract["tasks"]) == set(MINIMAL_PAYLOADS)
    for task, model, base, schema in bodies:
        for name, field in schema["properties"].items():
            types = _branches(field)
            if "integer" in types:
                whole = float(types["integer"].get("minimum", 0))
                request = base | {name: whole}
                jsonschema.validate(request, schema)
                taken = getattr(model.model_validate(request), name)
                assert (taken, type(taken)) == (int(whole), int), (task, name)
                half = base | {name: whole + 0.5}
                with pytest.raises(jsonschema.ValidationError):
                    jsonschema.validate(half, schema)
                with pytest.raises(ValidationError):
                    model.model_validate(half)
                tried.append(name)
            elif "number" in types:
                request = base | {name: 30}
                jsonschema.validate(request, schema)
                assert getattr(model.model_validate(request), name) == 30, (task, name)
                tried.append(name)
    assert {"priority", "max_attempts", "within_s"} <= set(tried)


def test_every_reason_code_maps_each_end_to_flip_statuses(contract):
    assert set(contract["reason_codes"]) == {c.value for c in REASONS}
    for code, entry in contract["reason_codes"].items():
        assert entry["meaning"]
        for state, flip in entry["flip"].items():
            assert state in {"COMPLETED", "FAILED", "ABORTED", "rejected"}, (code, state)
            assert set(flip) == {"model_status", "job_status"}


def test_the_signature_scheme_names_the_standard_webhooks_headers(contract):
    headers = contract["signature"]["headers"]
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}


def test_the_readme_reason_table_is_the_codes_table():
    assert reason_table_markdown() in README.read_text()


def test_readmes_event_mapping_keeps_the_job_on_a_caller_key_conflict() -> None:
    """Scenario: flip-api reuses a caller_key with another payload; the dispatcher sends a
    `kind: "rejected"` event whose job_id is the EXISTING (maybe running) job's id, with
    reason_code caller_key_conflict. A receiver built from tasks/README.md's event-to-FLIP
    table reads `kind: "rejected"` -> ERROR / COMPLETED and marks that live job's model
    ERROR. Promise (reason codes, models/reasons.py): caller_key_conflict leaves flip-api's
    statuses unchanged. Fix: the tasks/README.md row must say "ERROR/COMPLETED for reason_code
    rejected; unchanged for caller_key_conflict" (better: generate that row from REASONS
    too)."""
    from pathlib import Path

    from models.reasons import REASONS, ReasonCode

    assert REASONS[ReasonCode.CALLER_KEY_CONFLICT].flip[None].model_status is None
    readme = (Path(__file__).resolve().parents[2] / "tasks" / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith('| `kind: "rejected"`'))
    assert "caller_key_conflict" in row or "unchanged" in row, row

"""No copy of a refused message creates a job or is answered as one (tasks/README.md "What
flip-api may rely on"), flip-api's repeats and their copies included, and a refusal pruned
meanwhile loses no request. Each failed on the code before its fix (break-it on the first
version of the refused-before check: a refusal row kept only the first message's id, so a
repeat matched to it by key and payload recorded nothing for its own message; a copy whose
key named a job since was answered as that job's repeat; a UUID key was recorded keyless).
Every message a refusal answered has its row now (`refused_messages`)."""

from __future__ import annotations

from sqlalchemy import select

from app import names
from app.handlers import HANDLERS
from app.usecases import intake
from models import Job, RefusedMessage
from tests.unit.callback_world import cb, deliver, receiver

__all__ = ["cb", "receiver"]  # the fixtures, used by name

M1 = "5b0e4d1c-1f0a-4d7e-9a43-2f6c8d1e7a91"  # flip-api's first send (one Celery task id)
M2 = "9c1d2e3f-0000-4a4a-8b8b-123456789abd"  # flip-api's own repeat: a new task id


def _call(world, payload, message_id):
    handler = HANDLERS[names.ENQUEUE_JOB]
    return handler.call(world.rt, **handler.kwargs({"payload": payload}, message_id))


def _upload(world, name: str) -> None:
    """flip-api's upload of the job definition becomes visible under JOB_ROOT."""
    folder = world.rt.settings.job_root / name / "app" / "config"
    folder.mkdir(parents=True)
    (world.rt.settings.job_root / name / "meta.json").write_text(
        f'{{"name": "{name}", "deploy_map": {{"app": ["@ALL"]}}, "min_clients": 2}}'
    )


def _jobs(world) -> list[str]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(Job.caller_key)))


def _message_ids(world) -> list[str | None]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(RefusedMessage.message_id)))


def test_a_copy_of_a_repeat_refused_as_the_first_refusal_creates_the_job(cb, receiver):
    """Promise: a request answered `rejected` never becomes a job; no copy of a refused
    message creates a job. Sequence: flip-api sends payload P (message M1): refused, the
    definition's upload not visible yet (row: M1). flip-api repeats P as a new send (M2):
    refused again, matched to M1's row by caller_key + payload digest (one refusal, one
    event) and answered `rejected`, but M2 is recorded nowhere. The upload becomes
    visible; a copy of M2 (a redelivery after its worker was lost before the ack, a
    publish duplicate) reads REFUSED for M2, finds no row, and creates the job: M2 was
    answered `rejected` and became a job."""
    payload = {"caller_key": "flip-run-17c-1", "definition": "late-17c-1", "net": "net-a"}
    assert "rejected" in _call(cb, payload, M1)
    second = _call(cb, payload, M2)
    assert "rejected" in second
    deliver(cb, receiver)
    assert [p["kind"] for p, _, _ in receiver.requests] == ["rejected"]
    _upload(cb, "late-17c-1")
    copy = _call(cb, payload, M2)  # M2's redelivery
    assert "rejected" in copy and _jobs(cb) == [], (
        f"M2 was answered {second['reason_code']!r}; its copy answered {copy}, jobs "
        f"{_jobs(cb)} (refusal rows' message ids: {_message_ids(cb)})"
    )


def test_a_copy_of_a_refused_message_is_answered_with_a_job_once_a_repeat_created_it(cb, receiver):
    """Promise (`requests.enqueue_job`): "a copy of a refused message is answered with that
    refusal, whatever it reads as now"; GET-side, one message, one answer. Sequence: P sent
    as M1 is refused (upload not visible); the upload shows up; flip-api's own repeat of
    P (M2, a new task id) is judged again and creates the job (as documented). Then M1's
    redelivery arrives: its enqueue does not create (the key's job exists, same payload:
    a repeat), so REFUSED is never read, and M1, answered `rejected` before, is now
    answered with the job (created False): one message, two contradicting answers."""
    payload = {"caller_key": "flip-run-17c-2", "definition": "late-17c-2", "net": "net-a"}
    first = _call(cb, payload, M1)
    assert "rejected" in first
    _upload(cb, "late-17c-2")
    assert "job_id" in _call(cb, payload, M2)
    copy = _call(cb, payload, M1)  # M1's redelivery
    assert "rejected" in copy, f"M1 answered {first} first, then its copy {copy}"


def test_a_copy_refused_before_whose_row_is_pruned_meanwhile_fails_the_request(world, monkeypatch):
    """Promise: nothing flip-api sends is lost; one bad row never stops a request (a
    refused request is answered and recorded). Sequence: P (message M1) is refused; its
    row passes REJECTED_RETENTION_S (no prune has run yet: only a refusal prunes). A copy
    of M1 arrives once the upload is visible: its enqueue reads REFUSED (the row is still
    there) and rolls back (RefusedBefore); between that rollback and `refusal_of_message`'s
    own read, another request's refusal commits and prunes the expired row. The `assert
    kept is not None` in `requests.enqueue_job` fails: AssertionError, a FAILED verdict
    (acknowledged away): no answer, no job, no refusal row (under python -O: TypeError)."""
    from app.errors import InvalidRequest
    from app.handlers import on_error

    payload = {"caller_key": "flip-run-17c-3", "definition": "late-17c-3", "net": "net-a"}
    assert "rejected" in _call(world, payload, M1)
    world.clock.advance(world.rt.settings.rejected_retention_s + 60)
    _upload(world, "late-17c-3")
    real = intake.refusal_of_message

    def another_refusal_prunes_first(rt, message_id):
        intake.refuse_enqueue(rt, {"caller_key": "other-17c"}, InvalidRequest("bad"), M2)
        return real(rt, message_id)

    monkeypatch.setattr(intake, "refusal_of_message", another_refusal_prunes_first)
    try:
        copy = _call(world, payload, M1)
    except Exception as exc:
        handler = HANDLERS[names.ENQUEUE_JOB]
        verdict = on_error(handler, exc, 0, world.rt.settings)
        raise AssertionError(
            f"M1's copy raised {type(exc).__name__} ({verdict}); jobs {_jobs(world)}, "
            f"refusal rows {_message_ids(world)}"
        ) from exc
    assert "rejected" in copy or "job_id" in copy


def _as_received(payload: dict) -> dict:
    """The payload as a worker decodes it: Celery's json serializer is kombu's, which
    carries a UUID as {"__type__": "uuid", ...} and decodes it back to a UUID."""
    from kombu.utils.json import dumps, loads

    return loads(dumps({"payload": payload}))["payload"]


def test_a_uuid_caller_key_refused_twice_is_two_refusals_and_two_events(cb, receiver):
    """Promise: one refusal and one `rejected` event per refused request; flip-api's own
    repeat of a refused payload is the same refusal (tasks/README.md "Rejected events").
    Sequence: flip-api (Python) sends its per-run id as a `uuid.UUID` caller_key (the
    diff's own reason for decoding a bytes key: kombu's json hands back what the caller
    put in); kombu decodes it to a UUID; the model refuses it (not a string). The refusal
    is recorded keyless (`caller_key_of` reads only str and bytes), so flip-api's repeat
    of the same payload (M2) matches nothing: a second row and a second `rejected` event
    (and neither names the job id GET /jobs/{id} would be asked about)."""
    import uuid

    key = uuid.UUID("3f1c8a52-9d1e-4b7a-8c3e-2a4b6c8d0e1f")
    payload = {"caller_key": key, "definition": "tiny-job", "net": "net-a"}
    assert "rejected" in _call(cb, _as_received(payload), M1)
    assert "rejected" in _call(cb, _as_received(payload), M2)
    deliver(cb, receiver)
    kinds = [p["kind"] for p, _, _ in receiver.requests]
    assert kinds == ["rejected"], f"events {kinds}; refusal rows {_message_ids(cb)}"

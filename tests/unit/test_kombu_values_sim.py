"""The sweep reaches 8025614's two fixes for what Celery's serializer (kombu's json) hands a
worker from a Python flip-api, through `tests.sim.kombu_values`' band worlds (the simulated
broker carries flip-api's calls through kombu's json round trip, `app.sim.messages.carried`):

- F1: `EnqueueJob._metadata` turns the TypeError of `json.dumps` on metadata holding a UUID
  into a validation error (the enqueue refused and recorded). Undone (the unguarded
  `json.dumps` of before, its TypeError passed through by pydantic): the request fails and
  is acknowledged away, no job, no refusal, no `rejected` event (`no-escape`,
  `request-lost`; at the end `request-kept`).
- F2: `enqueue.payload_digest` digests a payload holding a non-JSON value (a datetime where
  a string is expected). Undone (None for such a payload): the second different payload
  under the key, refused for the same reason, is merged into the first's refusal
  (`request-kept`: two distinct refused payloads, one refusal).
- K (4811fde, break-it 3): `intake.caller_key_of` reads a caller_key kombu decoded to a
  `uuid.UUID` as its text. Undone (only str and bytes read): the refusal of a payload whose
  key is a UUID is recorded keyless, so the key names no refusal and flip-api's repeat is
  a second one (`request-kept`: the key's request lost).

- S (487ce8d, review 20 A): `Handler.kwargs` takes a request sent in another shape than
  its one `payload` kwarg as a misshapen payload, refused and recorded under the key it
  carried. Undone (its kwargs passed as they came, positional arguments a TypeError): the
  request fails and is acknowledged away (`no-escape`, `request-lost`).
- N (e7ea82e, review 20 A): `intake.caller_key_of` reads a JSON number key as its decimal
  text. Undone (no key): the refusal is recorded keyless (`request-kept`).

With each fix undone its seeds report; the same seeds are clean with it. Seeds 300-1000's 19
band worlds: 19 report with F1 undone (`no-escape`, `request-lost`, `request-kept`), 19 with
F2 undone (`request-kept`); 0 of 300-1500's 41 with both fixes. Round 20, seeds 0-2000's 68
band worlds: 68 report with S undone, 68 with N undone, 0 with both fixes."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from pydantic import field_validator

from app import handlers
from app.payload_json import nesting_depth
from app.schemas import METADATA_MAX_DEPTH, EnqueueJob
from app.usecases import enqueue, intake
from tests.unit.test_simulation_safeguards import Safeguard, safeguard_tests

pytestmark = pytest.mark.unit

FINDS = frozenset({"request-kept", "request-lost", "no-escape"})

_METADATA = EnqueueJob.__pydantic_decorators__.field_validators["_metadata"].func


class _MetadataBefore(EnqueueJob):
    """EnqueueJob with its metadata validator as before 8025614: `json.dumps` unguarded, so
    a value JSON has no form for raises TypeError out of the validator."""

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if (
            value is not None
            and all(isinstance(key, str) for key in value)
            and nesting_depth(value, METADATA_MAX_DEPTH) <= METADATA_MAX_DEPTH
        ):
            # Past the key and depth checks, the size measured unguarded.
            json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        kept: dict[str, Any] | None = _METADATA(value)
        return kept


def _metadata_type_error(mp: pytest.MonkeyPatch) -> None:
    # F1 undone: every EnqueueJob.model_validate runs the old validator.
    mp.setattr(EnqueueJob, "__pydantic_validator__", _MetadataBefore.__pydantic_validator__)


def _no_digest_for_python_values(mp: pytest.MonkeyPatch) -> None:
    # F2 undone: no digest for a payload `json.dumps` (no `default`) cannot serialise.
    real = enqueue.payload_digest

    def before(payload: Any) -> str | None:
        try:
            json.dumps(payload, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError):
            return None
        return real(payload)

    mp.setattr(enqueue, "payload_digest", before)


def _uuid_key_keyless(mp: pytest.MonkeyPatch) -> None:
    # K undone: a caller_key that is neither str nor bytes is no key.
    real = intake.caller_key_of

    def before(payload: Any) -> str | None:
        key = payload.get("caller_key") if isinstance(payload, dict) else None
        return None if isinstance(key, uuid.UUID) else real(payload)

    mp.setattr(intake, "caller_key_of", before)


def _misshapen_failed(mp: pytest.MonkeyPatch) -> None:
    # 487ce8d undone: a request's kwargs passed to its handler as they came (its fields as
    # kwargs: the call's TypeError), positional arguments refused by the task's `run(self,
    # **kwargs)` (Python's TypeError); either fails the task, acknowledged away.
    def before(
        self: handlers.Handler, sent: dict[str, Any], message_id: str, args: tuple[Any, ...] = ()
    ) -> dict[str, Any]:
        if args:
            raise TypeError(f"run() takes 1 positional argument but {len(args) + 1} were given")
        return {**sent, "message_id": message_id} if self.message_id else sent

    mp.setattr(handlers.Handler, "kwargs", before)


def _number_key_keyless(mp: pytest.MonkeyPatch) -> None:
    # e7ea82e undone: a caller_key that is a JSON number is no key.
    real = intake.caller_key_of

    def before(payload: Any) -> str | None:
        sent = payload.sent if isinstance(payload, intake.Misshapen) else payload
        key = sent.get("caller_key") if isinstance(sent, dict) else None
        return None if isinstance(key, int) and not isinstance(key, bool) else real(payload)

    mp.setattr(intake, "caller_key_of", before)


CASES = [
    Safeguard(
        "metadata holding a UUID kombu decoded is refused and recorded, not lost (F1)",
        _metadata_type_error,
        "clean",
        range(486, 487),
        FINDS,
    ),
    Safeguard(
        "two payloads holding datetimes under one key are two refusals (F2)",
        _no_digest_for_python_values,
        "clean",
        range(504, 505),
        FINDS,
    ),
    Safeguard(
        "a UUID caller_key kombu decoded is recorded under its text (K)",
        _uuid_key_keyless,
        "clean",
        range(486, 487),
        FINDS,
    ),
    Safeguard(
        "a misshapen enqueue is refused and recorded, not failed away (487ce8d)",
        _misshapen_failed,
        "clean",
        range(486, 487),  # the payload positional (misconfig 493: its fields as kwargs)
        FINDS,
    ),
    Safeguard(
        "a JSON number caller_key is recorded under its text (e7ea82e)",
        _number_key_keyless,
        "clean",
        range(486, 487),
        FINDS,
    ),
]


test_the_sweep_finds_a_kombu_fix_undone, test_the_same_seeds_are_clean_with_the_fix = (
    safeguard_tests(CASES, timeout_s=600)
)

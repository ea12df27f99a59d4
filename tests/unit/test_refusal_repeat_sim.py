"""The sweep reaches round 17's one-refusal-per-request fixes (d406103, and migration 0022's
message id) through `tests.sim.refusal_repeat`'s band worlds (`one-refusal-per-request`):

- D1: a copy of a message refused before (its id) never creates a job: it is answered with
  that refusal (`kicks.EnqueueKick.refused`, read with the kick's marker; first built as a
  look-up on retries only). Undone: refused first (the definition's folder missing), the
  commit applied and its reply lost, the folder shows up, the retry creates the job: a
  `rejected` event, then QUEUED, for one request (servers 427; 4 of 0-700's 21 band worlds).
- D2/D3: the refusal's payload digest in the match (`enqueue.payload_digest`). Undone: the
  second payload under the key refused for the same reason is swallowed (clean 432), or the
  late repeat of a refused payload, after the corrected request created the job, is a
  second refusal, `caller_key_conflict` (servers 652); 28 of 300-1000's 37 band worlds
  (35 since round 18's copy worlds).
- 0022: the enqueue handler takes the message id. Undone: a keyless refusal retried after
  a lost commit reply is recorded twice (clean 432).
- 3201f00 (break-it 3): every message a refusal answered keeps its row (`refused_messages`),
  flip-api's repeat matched to an earlier refusal too. Undone (a matched repeat records
  nothing for its own message): flip-api's early repeat, refused like the first payload,
  is copied (a duplicate delivery, its task id) after the definition's upload shows up, and
  the copy creates the job (clean 945; 6 of 300-1500's 64 band worlds, of the 10 copy
  worlds: LATE, the refusal's reply kept).
- 3201f00 (break-it 3): a copy of a refused message whose key names a job since (flip-api's
  repeat, judged again once the upload showed up, created it) reads its message's refusal
  too. Undone (read only where the enqueue creates the job): under the module's own key the
  copy of the refused message is answered as the job's repeat, one message answered
  `rejected` and then a job (clean 945; 10 of 300-1500's 64 band worlds: every copy
  world).

With each fix undone its seed reports; the same seeds are clean with it (and 0 of the 37
band worlds of 300-1000 report with every fix in; 0 of 300-1500's 64 with round 18's
copies)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import delete, func, select

from app import names
from app.handlers import HANDLERS
from app.usecases import enqueue, intake, kicks
from models import RefusedMessage, RejectedRequest
from tests.unit.test_simulation_safeguards import Safeguard, safeguard_tests

pytestmark = pytest.mark.unit

FINDS = frozenset({"one-refusal-per-request"})


def _retry_judged_again(mp: pytest.MonkeyPatch) -> None:
    # D1 undone: an enqueue that created a job never reads its message as refused before.
    real = kicks.EnqueueKick.abort_waits

    def forgetting(self: kicks.EnqueueKick, session: Any, job_id: Any, now: Any) -> bool:
        waits = real(self, session, job_id, now)
        self.refused = False
        return waits

    mp.setattr(kicks.EnqueueKick, "abort_waits", forgetting)


def _no_digest(mp: pytest.MonkeyPatch) -> None:
    # D2/D3 undone: refusals matched by key, code and reason only.
    mp.setattr(enqueue, "payload_digest", lambda _payload: None)


def _no_message_id(mp: pytest.MonkeyPatch) -> None:
    # 0022 undone: the enqueue handler is not given its message's id.
    handler = dataclasses.replace(HANDLERS[names.ENQUEUE_JOB], message_id=False)
    mp.setitem(HANDLERS, names.ENQUEUE_JOB, handler)


def _matched_repeat_not_kept(mp: pytest.MonkeyPatch) -> None:
    # 3201f00 undone: a message matched to an earlier refusal (by key and payload digest)
    # keeps no row of its own; only the message that created a refusal has one.
    real = enqueue.record_rejection

    def before(session: Any, *args: Any, message_id: str | None = None, **kw: Any) -> Any:
        own = enqueue.refusal_of_message(session, message_id)
        top = session.scalar(select(func.max(RejectedRequest.id))) or 0
        same = real(session, *args, message_id=message_id, **kw)
        message = enqueue.recordable_message_id(message_id)
        if own is None and message is not None and same.id <= top:  # an earlier refusal
            session.flush()
            session.execute(delete(RefusedMessage).where(RefusedMessage.message_id == message))
        return same

    mp.setattr(enqueue, "record_rejection", before)


class _EnqueueBefore:
    """`app.usecases.enqueue` as intake read it before 3201f00: no refused-before read for
    an enqueue that did not create its job (the kick's own read is left as it is)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(enqueue, name)

    @staticmethod
    def refused_before(_session: Any, _message_id: str | None) -> bool:
        return False


def _repeat_of_job_not_read(mp: pytest.MonkeyPatch) -> None:
    # 3201f00 undone: a copy that finds its key's job (the same payload) is that job's repeat.
    mp.setattr(intake, "enqueue", _EnqueueBefore())


REFUSALS = [
    Safeguard(
        "a copy of a refused message is answered from its refusal, never a job (D1)",
        _retry_judged_again,
        "servers",
        range(427, 428),
        FINDS,
    ),
    Safeguard(
        "another payload under the key refused for the same reason is recorded (D2)",
        _no_digest,
        "clean",
        range(432, 433),
        FINDS,
    ),
    Safeguard(
        "flip-api's late repeat of a refused payload is the same refusal (D3)",
        _no_digest,
        "servers",
        range(652, 653),
        FINDS,
    ),
    Safeguard(
        "a keyless refusal retried after a lost commit reply is recorded once (0022)",
        _no_message_id,
        "clean",
        range(432, 433),
        FINDS,
    ),
    Safeguard(
        "a copy of a repeat matched to an earlier refusal never creates the job (3201f00)",
        _matched_repeat_not_kept,
        "clean",
        range(945, 946),
        FINDS,
    ),
    Safeguard(
        "a copy of a refused message whose key names a job since is answered refused (3201f00)",
        _repeat_of_job_not_read,
        "clean",
        range(945, 946),
        FINDS,
    ),
]


test_the_sweep_finds_a_refusal_fix_undone, test_the_same_seeds_are_clean_with_the_fix = (
    safeguard_tests(REFUSALS, timeout_s=600)
)

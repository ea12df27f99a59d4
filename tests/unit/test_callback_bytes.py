"""The exact bytes a status callback is sent as (tasks/README.md "Status callbacks"): the
receiver verifies an HMAC over the raw body, so a body that changes by a byte (a key's
order, a space, an escaped character, a timestamp's offset) fails every receiver's check.
These are the bodies the sender sent before the read models became pydantic models
(issue 39 item 2), captured from it."""

from __future__ import annotations

from app.adapters.callbacks import Answer
from app.usecases import callbacks, intake
from tests.unit.callback_world import cb, complete  # noqa: F401 (cb: a fixture)
from tests.unit.conftest import World

# Metadata as flip-api may send it: text no ASCII escape may touch (a non-BMP character,
# quotes, a newline, a control character), a float, an integer past 2**64, nested objects
# whose keys come unsorted, a null and a boolean.
METADATA = {
    "z_last": 'Zürich ✓ 🧪 "quoted"\nnext\x01',
    "score": 0.1,
    "big": 123456789012345678901234,
    "nested": {"b": [1, 2.5, None, True], "a": "x"},
}

# What main at 61a9eb6 sent for them, in its order (one round sends the refusals first).
METADATA_SENT = (
    b'{"big":123456789012345678901234,"nested":{"a":"x","b":[1,2.5,null,true]},"score":0.1,'
    b'"z_last":"Z\xc3\xbcrich \xe2\x9c\x93 \xf0\x9f\xa7\xaa \\"quoted\\"\\nnext\\u0001"}'
)
SENT = [
    b'{"at":"2026-11-29T12:00:01.777777+00:00","caller_key":"bad-\xc3\xa9",'
    b'"event_id":"rejected-1","job_id":"67428e35-3659-5f4d-b007-3712e21d3ffa",'
    b'"kind":"rejected","reason":"unknown net \\"x\\"\\tplease","reason_code":"rejected"}',
    b'{"at":"2026-11-29T12:00:01.777777+00:00","caller_key":null,"event_id":"rejected-2",'
    b'"job_id":null,"kind":"rejected","reason":"no caller_key","reason_code":"rejected"}',
    b'{"at":"2026-11-29T12:00:01+00:00","attempt":1,"caller_key":"bytes-1","event_id":1,'
    + b'"from_state":null,"job_id":"bfbb2bba-f2c4-5a0d-8c2d-d7e873cfe969",'
    + b'"kind":"state_change","metadata":'
    + METADATA_SENT
    + b',"nvflare_job_id":null,"reason":"enqueued","reason_code":null,"to_state":"QUEUED"}',
    b'{"at":"2026-11-29T12:00:01.654321+00:00","attempt":1,"caller_key":"bytes-1",'
    + b'"event_id":2,"from_state":"QUEUED","job_id":"bfbb2bba-f2c4-5a0d-8c2d-d7e873cfe969",'
    + b'"kind":"state_change","metadata":'
    + METADATA_SENT
    + b',"nvflare_job_id":null,"reason":"net net-a reserved","reason_code":null,'
    + b'"to_state":"ASSIGNED"}',
    b'{"at":"2026-11-29T12:00:01.654321+00:00","attempt":1,"caller_key":"bytes-1",'
    + b'"event_id":3,"from_state":"ASSIGNED",'
    + b'"job_id":"bfbb2bba-f2c4-5a0d-8c2d-d7e873cfe969","kind":"state_change","metadata":'
    + METADATA_SENT
    + b',"nvflare_job_id":null,"reason":"server ready, submitting","reason_code":null,'
    + b'"to_state":"DISPATCHING"}',
    b'{"at":"2026-11-29T12:00:01.654321+00:00","attempt":1,"caller_key":"bytes-1",'
    + b'"event_id":4,"from_state":"DISPATCHING",'
    + b'"job_id":"bfbb2bba-f2c4-5a0d-8c2d-d7e873cfe969","kind":"state_change","metadata":'
    + METADATA_SENT
    + b',"nvflare_job_id":"nv-1","reason":"submitted as nv-1","reason_code":null,'
    + b'"to_state":"RUNNING"}',
    b'{"at":"2026-11-29T12:00:01.654321+00:00","attempt":1,"caller_key":"bytes-1",'
    + b'"event_id":5,"from_state":"RUNNING",'
    + b'"job_id":"bfbb2bba-f2c4-5a0d-8c2d-d7e873cfe969","kind":"state_change","metadata":'
    + METADATA_SENT
    + b',"nvflare_job_id":"nv-1","reason":"NVFLARE FINISHED:COMPLETED",'
    + b'"reason_code":"run_completed","to_state":"COMPLETED"}',
]


class RawReceiver:
    """A receiver that keeps each body as the sender's bytes, and accepts it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def post(self, body: bytes, headers: object) -> Answer:
        self.bodies.append(body)
        return Answer(200, "")

    def close(self) -> None:
        pass


def test_a_state_change_and_a_rejection_are_sent_as_the_same_bytes_as_before(cb: World):  # noqa: F811
    job_id = cb.enqueue("bytes-1", net="net-a", metadata=METADATA)
    cb.clock.advance(0.654321)  # the moves' timestamps with microseconds
    complete(cb, job_id)
    cb.clock.advance(0.123456)  # a timestamp with microseconds
    intake.record_refusal(cb.rt, "bad-\u00e9", 'unknown net "x"\tplease')
    intake.record_refusal(cb.rt, None, "no caller_key")
    receiver = RawReceiver()
    assert callbacks.deliver_callbacks(cb.rt, sender=receiver).delivered == 7
    assert receiver.bodies == SENT

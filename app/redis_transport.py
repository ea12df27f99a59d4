"""kombu's Redis transport with one fix: a channel closes completely even when the socket it
is reading BRPOP from is already dead. Selected by `celery_config` for `redis://` brokers.

Why (measured with celery 5.7.0, kombu 5.7.0, redis-py 8.1.0 and 7.4.1; reproducer:
`python -m tests.tools.redis_restart_repro --mode eta`): when Redis restarts while the worker
holds an unacknowledged message (an ETA/countdown message such as `wait_ready`'s next poll, or
a running late-ack task) and its consumer channel is waiting in BRPOP, the worker died with
`Unrecoverable error: AttributeError("'NoneType' object has no attribute 'hostname'")`:

1. celery's consumer sees the connection error and calls `connection.collect()`;
2. collect closes the channel; kombu's `Channel.close()` first drains the pending BRPOP reply
   (`_brpop_read`, kept so a popped message is not lost, kombu#1733); on the dead socket that
   raises `ConnectionError`, which aborts `close()` half way: the channel stays open with its
   unacked message, and collect ignores the error and detaches the transport
   (`transport.client = None`);
3. celery 5.7 then also calls `connection.close()` (celery#10242, added so the broken socket
   is released before reconnecting); this closes the same channel a second time, now with no
   BRPOP pending, so it reaches `QoS.restore_unacked()`, which builds a new Redis pool from
   `transport.client`, which is None: AttributeError in `_connparams`. `ignore_errors` only
   swallows connection and channel errors, so it escapes the consumer's recovery path and
   stops the worker.

celery 5.6.x does not have step 3 (it survives, but it lacks 5.7's reconnect fixes, among
them a hang in the same recovery path, celery#9705); celery 5.7 requires kombu >= 5.7, and no
kombu or redis-py release changes steps 1-2. So the fix is here: when the BRPOP drain fails
with a connection error the socket is gone and nothing more can be read from it, and the
channel goes on closing while the transport is still attached. Its unacked messages are then
restored (if Redis is reachable again) or dropped with the connection they came from; the
SQL rows stay the source of truth and reconcile re-drives any job whose message was lost.
"""

from __future__ import annotations

import logging
from queue import Empty

from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)

# What `broker_transport` names; a dotted path is allowed there (never in a URL).
TRANSPORT_PATH = "app.redis_transport:Transport"


class Channel(kombu_redis.Channel):
    """kombu's Redis channel whose `close()` survives a dead BRPOP socket."""

    def close(self) -> None:
        """Drain a pending BRPOP reply if the socket still gives one, then close."""
        if self._in_poll:
            try:
                self._brpop_read()  # type: ignore[no-untyped-call]  # _in_poll is None after
            except Empty:
                pass
            except self.connection_errors as exc:
                log.info("broker socket already dead while closing a channel: %r", exc)
        super().close()  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above."""

    Channel = Channel

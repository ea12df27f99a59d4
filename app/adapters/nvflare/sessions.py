"""nvflare 2.9's admin sessions, handled so they cost what they must: a close that never
hangs a worker (it waits CLOSE_WAIT_S, then goes on in the background), and a login without
the extra second nvflare's first identity challenge costs (app/adapters/README.md,
"NVFLARE 2.9.0 behaviour this code relies on"). Used by `client.NvflareAdminClient`."""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


# How long a caller waits for an nvflare session to close. nvflare's close stops the
# session's cell, which joins its executor threads; under load that join was seen to hang
# past a 600 s test timeout, holding a worker's slot (and a job's readiness poll) with it.
# Past this bound the close goes on in a daemon thread; a logout to a server that is gone
# costs one command timeout, so a close that ends normally is still waited for.
CLOSE_WAIT_S = 15.0


def close_quietly(session: Any, *, logout: bool) -> None:
    """Close an nvflare session so its cell threads stop (an unclosed one keeps the process
    alive for 40 s+), waiting at most CLOSE_WAIT_S. `logout=False` skips the logout round
    trip to a server known gone."""
    done = threading.Event()

    def close() -> None:
        try:
            if logout:
                session.close()
            else:
                session.api.close()
        except Exception:  # closing must never mask the error being handled
            log.debug("closing an nvflare session failed", exc_info=True)
        finally:
            done.set()

    threading.Thread(target=close, name="nvflare-session-close", daemon=True).start()
    if not done.wait(CLOSE_WAIT_S):
        log.warning(
            "closing an nvflare session took over %.0f s; it goes on in the background",
            CLOSE_WAIT_S,
        )


_CHALLENGE_RETRY_S = 0.1


def install_fast_challenge_retry() -> None:
    """Make an admin login cost what it must, not one extra second.

    nvflare 2.9's `AdminAPI.connect` sends its first identity challenge right after starting
    its cell, before the cell's connector has connected, so that challenge always fails; the
    `Authenticator` then sleeps a hard-coded `retry_interval=1.0` before the next one. Every
    fresh login (each readiness poll of a cold start until one gets in) paid that second.
    The admin API's own module-level reference to `Authenticator` is replaced, once, by a
    subclass that retries after 0.1 s;
    sites and servers import the class elsewhere and are unaffected, and the overall login
    timeout is unchanged.
    """
    from nvflare.fuel.hci.client import api
    from nvflare.private.fed.authenticator import Authenticator

    if getattr(api.Authenticator, "fl_dispatcher_fast_retry", False):
        return

    class _FastRetryAuthenticator(Authenticator):  # type: ignore[misc]  # nvflare is untyped
        fl_dispatcher_fast_retry = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.retry_interval: float = min(
                float(kwargs.get("retry_interval", 1.0)), _CHALLENGE_RETRY_S
            )

    api.Authenticator = _FastRetryAuthenticator

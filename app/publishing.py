"""Publishing a use case's follow-up task: a broker that cannot take it (down, refusing,
unreachable) is logged and reported as False, never raised. The follow-up is sent after the
commit that made it necessary, so the rows already say what is owed, and beat, the step
leases and the reconciler find them again; an exception there would only stop the round
that sent it (an assign round's later claims) over a message it cannot send anyway."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kombu.exceptions import KombuError

log = logging.getLogger(__name__)


def published(task: str, publish: Callable[[], object]) -> bool:
    """Run `publish` (a send to the broker); False, logged, if the broker failed it."""
    try:
        publish()
    except (KombuError, OSError) as exc:
        log.warning("sending a task failed", extra={"task": task, "reason": str(exc)})
        return False
    return True

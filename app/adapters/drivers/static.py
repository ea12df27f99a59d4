"""The `static` scale driver: an always-on server that is never scaled.

The dispatcher does not call `scale` on an always-on net; if something does anyway, the
request is recorded (so tests and the status page can see it) and ignored.
"""

from __future__ import annotations

import logging

from app.adapters.drivers.base import Observation

log = logging.getLogger(__name__)


class StaticDriver:
    """Always reports one running replica; `scale` changes nothing."""

    kind = "static"

    def __init__(self, net_name: str | None = None) -> None:
        self.net_name = net_name
        self.requested: list[int] = []  # every replica count anyone asked for, in order

    def scale(self, replicas: int) -> None:
        """Record the request and do nothing: a static server is never scaled."""
        self.requested.append(replicas)
        log.info(
            "static driver%s: asked for %d replica(s); always on, nothing to do",
            f" of net {self.net_name}" if self.net_name else "",
            replicas,
        )

    def observe(self) -> Observation:
        """One replica, desired and running: a static server is assumed up."""
        return Observation(desired=1, running=1, pending=0)

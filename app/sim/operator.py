"""What the operator does in a simulated world: a redeploy (new settings, every worker
restarted with them, each net that became always-on deployed at 1 replica), and, a while
after the workload's end, the human fix (the workers restarted if a net is still
MISCONFIGURED, an always-on net's server redeployed if its platform failed to start it or
someone scaled it to 0 by hand). A net NETS declares always-on that the dispatcher itself
left at 0 replicas is the dispatcher's to bring up (`watch_always_on`): no human fixes that,
or the sweep would never see the dispatcher fail to (round 14's left start)."""

from __future__ import annotations

import functools

from app.sim.view import SimView
from models import NetState


class Operator:
    """The operator's side of a simulation."""

    def __init__(self, sim: SimView) -> None:
        self.sim = sim
        # The deploy leaves the service's desired count as it is (Terraform's ignore_changes
        # on desired_count, the usual setup for a count an application manages): a net made
        # always-on is the dispatcher's to bring up (tests.sim.left_starts sets it).
        self.keeps_count = False

    def redeploy(self, what: str) -> None:
        """A redeploy: new settings, every worker restarted with them; an operator deploys
        at 1 replica each scalable net that is always-on now and was not before."""
        sim = self.sim
        t = sim.clock.t
        before = {n.name: sim.scales_to_zero(n.name) for n in sim.declared.nets}
        sim.reconfigure()
        sim.trace(f"== redeploy: {what}")
        for slot in (0, 1):
            sim.restart_worker(slot, "redeploy with new settings")
        for net in sim.declared.nets:
            if (
                net.kind == "ecs"
                and before.get(net.name, True)
                and not sim.scales_to_zero(net.name)
            ):
                # Always-on now: the operator's deploy runs the service at 1 replica.
                delay = sim.rng.uniform(0.0, 60.0)
                if self.keeps_count:
                    continue
                sim.at(
                    t + delay,
                    f"operator deploys {net.name} at 1 replica",
                    functools.partial(self._deploy, net.name),
                )

    def _deploy(self, net: str) -> None:
        self.sim.cluster.drivers[net].apply(1, self.sim.clock.t)

    def human_fix(self) -> None:
        """Paged after faults stopped: restart the workers if a net is MISCONFIGURED, and
        redeploy an always-on net whose server failed to start or was scaled to 0."""
        sim = self.sim
        states = {NetState(r[0]) for r in sim.conn.execute("SELECT state FROM nets")}
        if states & {NetState.MISCONFIGURED}:
            for slot in (0, 1):
                sim.restart_worker(slot, "a human fixed the settings")
        # Paged for an always-on net in OUTAGE whose platform failed to start its server,
        # or whose service someone scaled to 0 by hand (the dispatcher never scales such
        # a net): the operator redeploys it (seeds 1157 and 2499: jobs waited for ever).
        # A declared net the dispatcher left at 0 itself is not undone: that is its omission
        # (tests.sim.always_on_starts, `always-on-replica`).
        for name, driver in sim.cluster.drivers.items():
            if sim.scales_to_zero(name):
                continue
            dispatchers = sim.declared_net(name) and not driver.by_hand
            if driver.failure is not None or (driver.desired == 0 and not dispatchers):
                why = "failed to start" if driver.failure is not None else "was scaled to 0"
                driver.failure = None
                sim.trace(f"   a human redeploys {name}: its server {why}")
                driver.apply(1, sim.clock.t)

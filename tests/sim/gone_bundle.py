"""A job's bundle gone between a lost submit reply and the retry (round 16, defect B): in
bands of the first draw of `f"{seed}/gone-bundle"` (about 8.5% of the worlds; none of the
safeguards' and sweep-seed tests' seeds in them, so every other world replays exactly), the
first submit of a job from the folder under JOB_ROOT to an NVFLARE server lands and loses its
reply, and at that moment the folder is removed (an operator's clean-up, a redeploy of the
bundles); it is written back, the same version, once the job has left DISPATCHING (or 60 s
on). The retried submit finds the bundle gone and fails the job: the fixed step keeps the
attempt's token as a stray, so the landed run is found and stopped; before ef0a537 the net
was freed with no stray, the run lived on uncounted and the next job was submitted beside
it (`unaccounted-run`, `claim-beside-live-run`, `one-run-per-server`). The adversary's
bundle changes (tests.sim.adversary) only ever replace a bundle."""

from __future__ import annotations

import random

from app.sim.bundles import LOCAL_DEFINITION, remove_tree
from app.sim.simulation import Simulation

BANDS = ((0.6390, 0.6805), (0.5855, 0.6080), (0.7570, 0.7805))
STREAM = "gone-bundle"
BACK_AFTER_S = 60.0  # the folder is back by then whatever the job does


def in_bands(seed: int) -> bool:
    """Whether the seed's world removes the bundle."""
    first = random.Random(f"{seed}/{STREAM}").random()
    return any(lo <= first < hi for lo, hi in BANDS)


class GoneBundle:
    """Loses the reply of the first local-bundle submit and removes the folder meanwhile."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.active = in_bands(sim.seed)
        self.job: str | None = None  # the job whose submit landed (hex), once it has
        self._removed_at = 0.0
        self._nvflare = {n.name for n in (*sim.world.nets, *sim.world.spare)}
        self._nvflare -= {n.name for n in sim.world.nets if n.backend != "nvflare"}

    def at_hook(self, point: str, net: str | None) -> None:
        """At the first landed submit of a job from the local folder: reply lost, folder gone."""
        sim = self.sim
        if not self.active or self.job is not None or point != "admin.submit.after":
            return
        if net not in self._nvflare or not sim.current:
            return
        job_id = sim.current[-1].kwargs.get("job_id")
        spec = sim.job_spec(str(job_id)) if job_id else None
        if spec is None or spec.definition != LOCAL_DEFINITION:
            return
        t = sim.clock.t
        self.job = str(job_id).replace("-", "")
        self._removed_at = t
        sim.cluster.servers[net].reply_loss.append((t, t + 1e-6))  # this submit's reply only
        remove_tree(sim.local_bundle.folder)
        sim.trace(f"== {net}: {str(job_id)[:8]}'s submit landed, its reply lost; bundle removed")

    def after_step(self) -> None:
        """The folder written back once the job left DISPATCHING (or BACK_AFTER_S on)."""
        sim = self.sim
        if self.job is None or sim.local_bundle.folder.exists():
            return
        row = sim.conn.execute("SELECT state FROM jobs WHERE id = ?", (self.job,)).fetchone()
        late = sim.clock.t - self._removed_at >= BACK_AFTER_S
        if row is not None and row[0] == "DISPATCHING" and not late:
            return
        sim.local_bundle.rewrite()
        sim.trace("== the bundle's folder is written back (the same version)")

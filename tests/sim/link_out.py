"""A link out of JOB_ROOT in the job folder (round 23, 90ba4c8 and 3bd81e2): in bands of the
first draw of `f"{seed}/link-out"` (about 6% of the worlds; none of the seeds the unit tests
name in them, so every other world replays exactly), at a drawn moment the local bundle
(app.sim.bundles.LocalBundle, the folder under JOB_ROOT) gets `app/config/site.key`, a link
to a file outside JOB_ROOT (in the simulation's own folder, as an admin kit's private key
lies beside the job root) holding a marker of its own; in half of them a second shape
with it: `app/config/kit`, a link to a folder outside the root (a file in it holding the
marker), or `app/config/shared.json`, a link to a file inside the root (code shared between
jobs: followed, and it stays once the links out are gone). The links out are removed
20-90 s later (the bundle's owner notices) and the world goes on.

`nothing-from-outside-root` (checked by tests.sim.invariants' Checker):
- no submitted folder (an NVFLARE submit, a Flower start-run's) holds the marker;
- no submit while a link out is in the folder sends a copy prepared since it was placed
  (such a copy was built from a bundle holding it: its job must fail instead);
- a job refused for one of these links ends FAILED `definition_invalid`; none is refused
  for the link inside the root.
A job so refused is left to the usual invariants (never stuck DISPATCHING, its net released).
Before 90ba4c8 the linked file was copied into the prepared job and submitted."""

from __future__ import annotations

import os
import random
from pathlib import Path

from app.sim.simulation import Simulation

# Bands around the unit tests' named seeds (safeguards', sweep seeds', replays').
BANDS = ((0.2440, 0.2590), (0.4030, 0.4185), (0.4290, 0.4465), (0.7850, 0.7975))
STREAM = "link-out"
INVARIANT = "nothing-from-outside-root"
FILE_OUT, FOLDER_OUT, INSIDE = "site.key", "kit", "shared.json"
SECOND_SHAPES = (FOLDER_OUT, INSIDE)
WHY = "links outside the job root"  # app.adapters.bundle_copy's words


def in_bands(seed: int) -> bool:
    """Whether the seed's world puts a link out of JOB_ROOT in its job folder."""
    first = random.Random(f"{seed}/{STREAM}").random()
    return any(lo <= first < hi for lo, hi in BANDS)


class LinkOut:
    """Places the links in a band world's job folder and removes the links out later; the
    checker's `on_submit` and `check` for them."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.active = in_bands(sim.seed)
        self.placed = False
        self._event_id = 0
        self._snapshot: frozenset[str] = frozenset()  # prepared copies when the links came
        if not self.active:
            return
        rng = random.Random(f"{sim.seed}/{STREAM}")
        rng.random()  # the band's draw
        self.at_s = round(rng.uniform(5.0, 120.0), 1)
        self.back_s = round(self.at_s + rng.uniform(20.0, 90.0), 1)
        self.second = rng.choice(SECOND_SHAPES) if rng.random() < 0.5 else None
        self.marker = f"LINK-OUT-MARKER-{sim.seed}-{rng.getrandbits(64):016x}"
        config = sim.local_bundle.folder / "app" / "config"
        self.links_out = [config / FILE_OUT] + ([config / FOLDER_OUT] * (self.second == FOLDER_OUT))
        self.inside = config / INSIDE if self.second == INSIDE else None

    def schedule(self) -> None:
        """The links' moment and the links out's removal."""
        if not self.active:
            return
        shapes = " and ".join([FILE_OUT, *([self.second] if self.second else [])])
        self.sim.at(
            self.at_s, f"links placed in the job folder's app/config: {shapes}", self._place
        )
        self.sim.at(self.back_s, "the job folder's links out of JOB_ROOT removed", self._remove)

    def _place(self) -> None:
        sim = self.sim
        outside = sim.root / "outside"  # beside JOB_ROOT (sim.root / "jobs"), not under it
        (outside / "kit").mkdir(parents=True, exist_ok=True)
        (outside / "client.key").write_text(f"{self.marker}\n")
        (outside / "kit" / "client.key").write_text(f"{self.marker}\n")
        config = sim.local_bundle.folder / "app" / "config"
        if not config.is_dir():
            sim.trace("== no job folder to place links in (removed meanwhile)")
            return
        self._snapshot = frozenset(_prepared(sim))
        (config / FILE_OUT).symlink_to(outside / "client.key")
        if self.second == FOLDER_OUT:
            (config / FOLDER_OUT).symlink_to(outside / "kit", target_is_directory=True)
        elif self.inside is not None:
            shared = sim.settings.job_root / "shared"
            shared.mkdir(exist_ok=True)
            (shared / "common.json").write_text('{"shared": true}\n')
            self.inside.symlink_to(shared / "common.json")
        self.placed = True
        sim.stats["link-out placed"] = 1
        sim.trace(f"== the job folder links out of JOB_ROOT ({self.marker})")

    def _remove(self) -> None:
        for link in self.links_out:
            if os.path.lexists(link):
                link.unlink()

    def _out_now(self) -> bool:
        return self.placed and any(os.path.lexists(link) for link in self.links_out)

    def _local(self, token: str) -> bool:
        """Whether the token's job is of a folder under JOB_ROOT that is the local bundle
        (its own name, or another name linking to it: tests.sim.refusal_race)."""
        row = self.sim.conn.execute(
            "SELECT definition FROM jobs WHERE id = ?", (token[:36].replace("-", ""),)
        ).fetchone()
        if row is None or str(row[0]).startswith("s3://"):
            return False
        folder = self.sim.settings.job_root / str(row[0])
        return folder.resolve() == self.sim.local_bundle.folder.resolve()

    # --- the checker's -------------------------------------------------------------------------

    def on_submit(self, token: str, folder: Path) -> None:
        """No submitted folder holds the marker; none prepared while a link out was in the
        bundle is submitted while it still is; one prepared since the link inside the root
        came holds that link's file."""
        if not self.placed:
            return
        held = _holding(folder, self.marker)
        if held is not None:
            self.sim.report(
                INVARIANT,
                f"submit {token[:8]}-{token[37:]}",
                f"the submitted folder holds {held}: a file from outside JOB_ROOT",
            )
            return
        if str(folder) in self._snapshot or not self._local(token):
            return  # (a copy prepared before the links came, or of another bundle)
        if self._out_now():
            self.sim.report(
                INVARIANT,
                f"submit {token[:8]}-{token[37:]}",
                f"{folder.name} was prepared while the bundle linked out of JOB_ROOT",
            )
        elif self.inside is not None and os.path.lexists(self.inside):
            # Prepared since the link inside the root came, which is there still: followed.
            sim = self.sim
            sim.stats["link-inside submits"] = sim.stats.get("link-inside submits", 0) + 1
            shared = folder / "app" / "config" / INSIDE
            if shared.is_symlink() or not shared.is_file():
                sim.report(
                    INVARIANT,
                    f"submit {token[:8]}-{token[37:]}",
                    f"the link inside the root (app/config/{INSIDE}) was not copied as its file",
                )

    def check(self) -> None:
        """After every step: a job refused for one of the links ends FAILED
        `definition_invalid`, and never for the link inside the root."""
        if not self.placed:
            return
        sim = self.sim
        rows = sim.conn.execute(
            "SELECT e.id, e.job_id, e.reason, j.reason_code FROM job_events e"
            " JOIN jobs j ON j.id = e.job_id WHERE e.id > ? AND e.to_state = 'FAILED'"
            " ORDER BY e.id",
            (self._event_id,),
        ).fetchall()
        for event_id, job_hex, written, code in rows:
            self._event_id = event_id
            reason = str(written)
            if self.inside is not None and f"config/{INSIDE}" in reason:
                sim.report(
                    INVARIANT,
                    f"job {job_hex[:8]}",
                    f"refused for a link inside the root: {reason[:200]}",
                )
                continue
            if WHY not in reason or not any(
                f"config/{link.name}" in reason for link in self.links_out
            ):
                continue
            sim.stats["link-out refusals"] = sim.stats.get("link-out refusals", 0) + 1
            if code != "definition_invalid":
                sim.report(
                    INVARIANT,
                    f"job {job_hex[:8]}",
                    f"refused for a link out as {code}: {reason[:200]}",
                )


def _prepared(sim: Simulation) -> list[str]:
    """The prepared copies now (app.adapters.jobdefs: data/prepared/<job>/<key>/<folder>)."""
    root = sim.settings.data_dir.resolve() / "prepared"
    return [str(p) for p in root.glob("*/*/*") if p.is_dir()] if root.is_dir() else []


def _holding(folder: Path, marker: str) -> str | None:
    """The first file under `folder` (links followed, each folder once) holding `marker`."""
    seen: set[str] = set()
    needle = marker.encode()
    for top, subfolders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        for name in names:
            path = os.path.join(top, name)
            try:
                with open(path, "rb") as handle:
                    if needle in handle.read():
                        return os.path.relpath(path, folder)
            except OSError:
                continue
    return None

"""A definition the file system cannot look up (round 16, defect C): in bands of the first
draw of `f"{seed}/long-definition"` (about 5.5% of the worlds; none of the safeguards' and
sweep-seed tests' seeds in them, so every other world replays exactly), flip-api enqueues
one more job whose definition is a folder name of 300 characters, past the 255 bytes a
directory entry may hold: the lookup under JOB_ROOT raises ENAMETOOLONG. The fixed enqueue
refuses it (recorded, a rejected event); before 880573c the OSError failed the request task
for good, acknowledged away unrecorded (`no-escape`, `request-lost`). The hostile payloads
(tests.sim.worlds) never send such a definition."""

from __future__ import annotations

import random

from app import names
from app.sim.simulation import Simulation

BANDS = ((0.0210, 0.0470), (0.5760, 0.6060))
STREAM = "long-definition"
KEY = "unnameable-0"
NAME_CHARS = 300  # past NAME_MAX (255 bytes on Linux's file systems)


def in_bands(seed: int) -> bool:
    """Whether the seed's world sends the definition."""
    first = random.Random(f"{seed}/{STREAM}").random()
    return any(lo <= first < hi for lo, hi in BANDS)


def schedule(sim: Simulation) -> bool:
    """flip-api's enqueue of a job whose definition cannot be looked up, at a random time
    of the workload's; False in a world outside the bands."""
    rng = random.Random(f"{sim.seed}/{STREAM}")
    first = rng.random()
    if not any(lo <= first < hi for lo, hi in BANDS):
        return False
    at = round(rng.uniform(0.0, 120.0), 1)
    payload: dict[str, object] = {
        "caller_key": KEY,
        "definition": "d" * NAME_CHARS,
        "required_sites": ["site-1"],
    }
    label = f"flip-api enqueues {KEY} (a definition of {NAME_CHARS} characters)"
    sim.at(at, label, sim.caller.sender(names.ENQUEUE_JOB, payload))
    return True

"""How the test command shares test modules out among pytest-xdist workers (`--dist loadfile`):
the slow modules first, and nothing long queued behind them.

xdist's own file scheduling hands out modules in order of their number of tests, so a module
of one long test (the simulator checked against reality, the server lost before a submit)
starts last and ends the phase alone; and a worker is handed its next module as soon as its
current one has two tests left (it needs the next test in hand to run the last one), so a long
module handed to a worker busy with another long one waits behind it while other workers go
idle. Here a module says how long it takes on the 2-core CI machine in its `EXPECTED_S`
(seconds, measured; none: short), and:

- a worker with nothing slow pending gets the slowest module left;
- a worker still busy with a slow module gets the shortest one left (modules that declare no
  time, fewest tests first), which keeps it fed without queueing anything long behind it.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

_EXPECTED = re.compile(r"^EXPECTED_S = (\d+(?:\.\d+)?)\b", re.MULTILINE)


@cache
def expected_s(root: Path, module: str) -> float:
    """The module's declared EXPECTED_S, read from its text (0: none declared). The
    controller process never imports test modules, so the number is read, not imported."""
    try:
        found = _EXPECTED.search((root / module).read_text(encoding="utf-8"))
    except OSError:
        return 0.0
    return float(found.group(1)) if found else 0.0


def next_module(queue: list[tuple[str, int]], weight: dict[str, float], busy: bool) -> str:
    """Which of the waiting modules (name, tests) a worker gets: the slowest when it is free of
    slow work, else the shortest (no declared time, fewest tests)."""
    if busy:
        return min(queue, key=lambda entry: (weight[entry[0]], entry[1]))[0]
    return max(queue, key=lambda entry: weight[entry[0]])[0]


class SlowFirstScheduling(LoadFileScheduling):
    """`--dist loadfile` with the choice of `next_module`."""

    def __init__(self, config: pytest.Config, log: object | None = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self._root = Path(str(config.rootpath))

    def _weight(self, module: str) -> float:
        return expected_s(self._root, module)

    def _busy_with_slow_work(self, node: WorkerController) -> bool:
        return any(
            self._weight(module) > 0 and not all(tests.values())
            for module, tests in self.assigned_work.get(node, {}).items()
        )

    def _assign_work_unit(self, node: WorkerController) -> None:
        queue = [(module, len(tests)) for module, tests in self.workqueue.items()]
        weight = {module: self._weight(module) for module, _ in queue}
        module = next_module(queue, weight, self._busy_with_slow_work(node))
        tests = self.workqueue.pop(module)
        self.assigned_work.setdefault(node, {})[module] = tests
        collection = self.registered_collections[node]
        node.send_runtest_some(
            [collection.index(nodeid) for nodeid, done in tests.items() if not done]
        )

"""pyproject.toml's bounds, .ci/requirements.lock and .ci/constraints.txt stay in step
(tests/README.md "Dependencies")."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

# pytest's own dependency, so present wherever the tests run.
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / ".ci" / "requirements.lock"
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REQUIREMENTS = [
    Requirement(r) for r in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["dev"]
]
PIN = re.compile(r"([A-Za-z0-9._-]+)==([^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def locked() -> dict[str, tuple[Version, list[str]]]:
    """Each package of the lock: its version and the hashes of its files."""
    found: dict[str, tuple[Version, list[str]]] = {}
    current: str | None = None
    for line in LOCK.read_text().splitlines():
        text = line.split("#", 1)[0].strip().removesuffix("\\").strip()
        if not text:
            continue
        if line.startswith(" "):
            assert current is not None and HASH.fullmatch(text), f"not a hash line: {line!r}"
            found[current][1].append(text)
            continue
        match = PIN.match(text)
        assert match, f"not a `name==version` entry: {line!r}"
        current = canonicalize_name(match.group(1))
        assert current not in found, f"{current} locked twice"
        found[current] = (Version(match.group(2)), [])
    return found


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = PIN.fullmatch(line)
        assert match, f"not a plain `name==version` pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"{name} pinned twice"
        found[name] = Version(match.group(2))
    return found


def test_the_lock_pins_every_package_with_hashes_and_not_the_project():
    lock = locked()
    assert canonicalize_name(PROJECT["name"]) not in lock
    assert len(lock) > len(REQUIREMENTS)  # the whole tree, not only the direct ones
    unhashed = sorted(name for name, (_, hashes) in lock.items() if not hashes)
    assert not unhashed, f"locked without a hash: {unhashed}"


def test_the_constraints_are_the_locks_versions():
    assert pins() == {name: version for name, (version, _) in locked().items()}, (
        "run `bash .ci/lock`"
    )


@pytest.mark.parametrize("requirement", REQUIREMENTS, ids=str)
def test_every_direct_dependency_is_locked_within_its_bounds(requirement):
    lock = locked()
    name = canonicalize_name(requirement.name)
    assert name in lock, f"{name} is not in {LOCK.name}: run `bash .ci/lock`"
    version = lock[name][0]
    assert requirement.specifier.contains(version, prereleases=True), (
        f"{name}=={version} is outside {requirement.specifier}: run `bash .ci/lock`"
    )


@pytest.mark.parametrize("requirement", REQUIREMENTS, ids=str)
def test_every_direct_dependency_has_a_floor_for_ci_floors_to_prove(requirement):
    assert any(spec.operator == ">=" for spec in requirement.specifier), requirement


def test_installs_use_the_lock_with_its_hashes():
    run_sh = (ROOT / "tests" / "run.sh").read_text()
    # pip installs uv alone, from its locked entry with its hashes; uv installs the rest.
    assert 'pip install --quiet --no-deps --require-hashes -r "$VENV/uv.lock.txt"' in run_sh
    assert "awk '/^uv==/" in run_sh
    # compiled at install: where PYTHONDONTWRITEBYTECODE is set, nothing else writes bytecode
    lock = '"${uv_install[@]}" --compile-bytecode --require-hashes -r .ci/requirements.lock'
    assert lock in run_sh
    assert '"${uv_install[@]}" --no-deps -e .' in run_sh  # nothing resolved past the lock
    assert ".ci/requirements.lock -nt" in run_sh  # a refreshed lock reinstalls


def test_the_dev_extra_holds_every_other_extra():
    """The tests install `.[dev]`: what an extra adds (plot, traces) is tested only if dev
    has it too, within the same bounds."""
    extras = PROJECT["optional-dependencies"]
    dev = set(extras["dev"])
    lacking = {name: sorted(set(reqs) - dev) for name, reqs in extras.items() if name != "dev"}
    assert {name: reqs for name, reqs in lacking.items() if reqs} == {}

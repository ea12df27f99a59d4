"""pyproject.toml's bounds and .ci/constraints.txt stay in step (README "Dependencies")."""

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
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REQUIREMENTS = [
    Requirement(r) for r in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["dev"]
]


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        assert match, f"not a plain `name==version` pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"{name} pinned twice"
        found[name] = Version(match.group(2))
    return found


def test_constraints_pin_plain_versions_and_not_the_project():
    pinned = pins()
    assert canonicalize_name(PROJECT["name"]) not in pinned
    assert len(pinned) > len(REQUIREMENTS)  # the whole tree, not only the direct ones


@pytest.mark.parametrize("requirement", REQUIREMENTS, ids=str)
def test_every_direct_dependency_is_pinned_within_its_bounds(requirement):
    pinned = pins()
    name = canonicalize_name(requirement.name)
    assert name in pinned, f"{name} is not in {CONSTRAINTS.name}: run `bash .ci/lock`"
    assert requirement.specifier.contains(pinned[name], prereleases=True), (
        f"{name}=={pinned[name]} is outside {requirement.specifier}: run `bash .ci/lock`"
    )


@pytest.mark.parametrize("requirement", REQUIREMENTS, ids=str)
def test_every_direct_dependency_has_a_floor_for_ci_floors_to_prove(requirement):
    assert any(spec.operator == ">=" for spec in requirement.specifier), requirement


def test_installs_use_the_constraints():
    run_sh = (ROOT / "tests" / "run.sh").read_text()
    assert "pip install --quiet -c .ci/constraints.txt -e '.[dev]'" in run_sh
    assert ".ci/constraints.txt -nt" in run_sh  # a refreshed file reinstalls

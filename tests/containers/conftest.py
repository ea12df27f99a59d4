"""The containers tier: a real container engine (podman's Docker-compatible API)."""

from __future__ import annotations

from pathlib import Path

import pytest

CONTAINERS_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder is the containers tier: `-m containers` selects exactly it,
    and `-m "not containers"` runs the rest of the suite without a container engine."""
    for item in items:
        if item.path.resolve().is_relative_to(CONTAINERS_DIR):
            item.add_marker(pytest.mark.containers)

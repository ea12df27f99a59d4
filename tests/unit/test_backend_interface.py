"""The use cases talk to a net's server through the backend's interface
(`app.adapters.backend`), never through one backend's modules (issue 38): a Flower net and
an NVFLARE net run through the same use cases."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USECASES = sorted((ROOT / "app" / "usecases").rglob("*.py"))
BACKENDS = ("app.adapters.nvflare", "app.adapters.flower")


def imported(path: Path) -> list[str]:
    """Every module a file imports, wherever the import is written (lazy ones too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", USECASES, ids=lambda p: p.name)
def test_no_use_case_imports_a_backend_s_own_modules(path: Path) -> None:
    found = [
        name
        for name in imported(path)
        if any(name == b or name.startswith(b + ".") for b in BACKENDS)
    ]
    assert found == [], f"{path.relative_to(ROOT)} imports {found}: use app.adapters.backend"


def test_the_interface_and_its_answers_live_in_the_backend_module() -> None:
    from app.adapters import backend

    for name in (
        "BackendClient",
        "ServerState",
        "Readiness",
        "RunStatus",
        "RunState",
        "AbortResult",
        "AbortOutcome",
    ):
        assert getattr(backend, name).__module__ == "app.adapters.backend", name

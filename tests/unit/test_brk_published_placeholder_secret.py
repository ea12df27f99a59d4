"""Break of round 23's change 5 (app/settings.py API_SECRET >= 16 characters).

Promise (tests/unit/test_api_secret_strength.py, the changelog's Unreleased): the API does
not slow guesses, and "a placeholder left in an env file" was the key found; "the length
rule keeps such a key from ever serving". The same round lengthened the example's
placeholder (app/deploy/examples/compose.env) until it passes the rule: an operator who
copies the example and forgets this one line now starts an api whose key of every mutating
route (enqueue, abort, drain everything) is printed in the public repository, no guessing
needed. Before, `change-me` stopped the start; now the placeholder serves.
Fix: refuse the example's placeholders (any `change-me` value) at start, or ship the line
empty/commented so an unset key leaves the routes disabled (403)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import SettingsError
from app.settings import load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "app" / "deploy" / "examples" / "compose.env"


def _example_value(name: str) -> str:
    for line in EXAMPLE.read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.partition("=")[2]
    raise AssertionError(f"{name} not in {EXAMPLE}")


@pytest.mark.parametrize("name", ["API_SECRET", "CALLBACK_SECRET"])
def test_the_examples_published_placeholder_secret_is_refused_at_start(name):
    placeholder = _example_value(name)
    assert "change-me" in placeholder
    with pytest.raises(SettingsError, match=name):
        load_settings(**{name: placeholder})

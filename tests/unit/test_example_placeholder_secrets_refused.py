"""The example env file's placeholders (app/deploy/examples/compose.env: `change-me...`) are
public: an operator who copies the example and forgets a line must not start a dispatcher
whose API key, callback signature or database password everyone who read the repository
knows, however long the placeholder. Each is refused at start, naming the setting."""

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


@pytest.mark.parametrize("name", ["DATABASE_URL", "BROKER_URL"])
def test_the_examples_placeholder_password_in_a_url_is_refused_at_start(name):
    password = _example_value("POSTGRES_PASSWORD")
    assert "change-me" in password
    url = f"postgresql+psycopg://fl:{password}@postgres:5432/fl"
    if name == "BROKER_URL":
        url = f"redis://:{password}@redis:6379/0"
    with pytest.raises(SettingsError, match=name) as refused:
        load_settings(**{name: url})
    assert password not in str(refused.value)


def test_a_secret_that_merely_mentions_change_me_later_starts():
    settings = load_settings(API_SECRET="0123456789abcdef-change-me")
    assert settings.api_secret.get_secret_value().endswith("change-me")

"""API_SECRET, the key of every mutating route, is refused at start when it is shorter than
16 characters, as CALLBACK_SECRET is; left unset, the mutating routes stay disabled (403).

Why: the mutating routes (enqueue, abort, drain the whole deployment, prewarm) are "behind
`X-API-Key`" (README.md "How flip-api calls it"), and compose's network lets job code reach
the api's port ("A site on that network can still reach the api's port: keep `API_SECRET`
set", app/entrypoints/README.md). The API answers a wrong key as fast as it is sent one (no
lockout, no delay): API_SECRET=a, a placeholder left in an env file, was found by trying
the printable characters, within 95 requests. The length rule keeps such a key from ever
serving; the API does not throttle guesses.
"""

from __future__ import annotations

import string

import pytest
from fastapi.testclient import TestClient

from app.entrypoints.api import create_app
from app.errors import SettingsError
from app.settings import load_settings
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of


@pytest.mark.parametrize("secret", ["a", "changeme", "0123456789abcde"])
def test_an_api_secret_shorter_than_a_callback_secret_may_be_is_refused_at_start(secret):
    with pytest.raises(SettingsError, match="API_SECRET must be at least 16") as refused:
        load_settings(API_SECRET=secret)
    if len(secret) > 1:  # never quoted (one letter is in any sentence)
        assert secret not in str(refused.value)


@pytest.mark.parametrize("secret", ["", "0123456789abcdef"])
def test_an_unset_or_16_character_api_secret_is_taken(secret):
    assert load_settings(API_SECRET=secret).api_secret.get_secret_value() == secret


def test_a_one_character_api_secret_serves_no_api_to_guess_it_from(
    tmp_path, job_root, sqlite_factory, clock
):
    with pytest.raises(SettingsError, match="API_SECRET"):
        world_of(
            [net_decl(tmp_path, "net-a", "ecs")],
            tmp_path,
            job_root,
            sqlite_factory,
            clock,
            API_SECRET="q",
        )


def test_a_key_of_16_characters_is_not_found_by_trying_every_character(
    tmp_path, job_root, sqlite_factory, clock
):
    key = "q" + "0123456789abcde"
    nets = [net_decl(tmp_path, "net-a", "ecs")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock, API_SECRET=key)
    client = TestClient(create_app(world.rt))
    for guess in string.printable.strip():
        answer = client.post("/drain", json={"all": True}, headers={"X-API-Key": guess})
        assert answer.status_code == 401, (guess, answer.text)
    answer = client.post("/drain", json={"all": True}, headers={"X-API-Key": key})
    assert answer.status_code != 401, answer.text

"""Review b: any API_SECRET is accepted, one character included, and nothing slows down
guessing it.

Promise: the mutating routes (enqueue, abort, drain the whole deployment, prewarm) are
"behind `X-API-Key`" (README.md "How flip-api calls it"), and compose's network lets job
code reach the api's port ("A site on that network can still reach the api's port: keep
`API_SECRET` set", app/entrypoints/README.md). The same settings refuse a CALLBACK_SECRET
shorter than 16 characters ("Unsigned (or guessably signed) status pushes would let anyone
on the path forge a job's end; refuse to start instead", app/settings.py), but take
API_SECRET=x, and the API answers wrong keys as fast as it is sent them: no lockout, no
delay, no count.

Scenario: API_SECRET=a (a placeholder left in an env file). A caller tries the printable
characters: within 95 requests it holds the key and may drain every net.
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
    with pytest.raises(SettingsError, match="API_SECRET"):
        load_settings(API_SECRET=secret)


def test_a_one_character_api_secret_is_not_found_by_trying_every_character(
    tmp_path, job_root, sqlite_factory, clock
):
    try:
        world = world_of(
            [net_decl(tmp_path, "net-a", "ecs")],
            tmp_path,
            job_root,
            sqlite_factory,
            clock,
            API_SECRET="q",
        )
    except SettingsError:
        return  # refused at start: nothing to guess
    client = TestClient(create_app(world.rt))
    found = None
    for tried, guess in enumerate(string.printable.strip(), start=1):
        answer = client.post("/drain", json={"all": True}, headers={"X-API-Key": guess})
        if answer.status_code != 401:
            found = (guess, tried, answer.status_code)
            break
    assert found is None, f"the key {found[0]!r} was guessed in {found[1]} requests: {found[2]}"

"""One attempt count at every door (issue 41): a job on its second attempt reads "2 of 3" in
the CLI, the status API, the nets page and its status callbacks alike (models.attempts)."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.entrypoints.api import create_app
from app.entrypoints.cli import main
from app.settings import Settings
from app.usecases import records
from models import JobState, attempt_number
from tests.fixtures.db import net_decl
from tests.unit.callback_world import SECRET, Receiver, deliver
from tests.unit.conftest import World

SETTINGS_ALIASES = [f.alias for f in Settings.model_fields.values() if f.alias]


@pytest.fixture(autouse=True)
def _isolated_logging():
    # main() installs a handler bound to the captured stderr; later tests must not write to it.
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "fl-dispatcher"]:
        root.removeHandler(handler)


@pytest.fixture
def env(monkeypatch, tmp_path, job_root, sqlite_url) -> dict[str, str]:
    """The settings of the world below, as the CLI reads them: from the environment."""
    for alias in SETTINGS_ALIASES:
        monkeypatch.delenv(alias, raising=False)
    values = {
        "FL_DISPATCHER_DATA_DIR": str(tmp_path / "data"),
        "DATABASE_URL": sqlite_url,
        "JOB_ROOT": str(job_root),
        "NETS": json.dumps([net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60)]),
        "PER_JOB_FL_SERVER": "true",
        "SERVER_LOST_GRACE_S": "30",
        "CALLBACK_URL": "http://flip-api.invalid/fl/callbacks",
        "CALLBACK_SECRET": SECRET,
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


@pytest.mark.parametrize(
    ("used", "max_attempts", "shown"),
    [(0, 3, 1), (1, 3, 2), (2, 3, 3), (3, 3, 3), (0, 1, 1), (1, 1, 1)],
)
def test_the_attempt_shown_counts_from_one_and_stops_at_max_attempts(used, max_attempts, shown):
    assert attempt_number(used, max_attempts) == shown


def test_a_job_on_its_second_attempt_reads_2_of_3_at_every_door(env, sqlite_factory, clock, capsys):
    world = World(Settings(), sqlite_factory, clock)
    job_id = world.enqueue("twice", net="net-a", max_attempts=3)
    world.run_until_ready(job_id)
    with world.rt.sessions.begin() as session:  # the first attempt gave up before its submit
        assert records.requeue_job(session, job_id, "sites never connected", world.clock())
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 1)
    world.run_pipeline(job_id)
    assert world.job(job_id).state == JobState.RUNNING

    # Callbacks: each event carries the attempt of its move; the last ones the second.
    receiver = Receiver()
    deliver(world, receiver)
    moves = [(p["to_state"], p["attempt"]) for p, _, _ in receiver.requests]
    assert moves == [
        ("QUEUED", 1),
        ("ASSIGNED", 1),
        ("QUEUED", 2),
        ("ASSIGNED", 2),
        ("DISPATCHING", 2),
        ("RUNNING", 2),
    ]
    requeue = next(p for p, _, _ in receiver.requests[1:] if p["to_state"] == "QUEUED")
    assert "requeued for attempt 2 of 3:" in requeue["reason"]

    # The status API: the job, and each move of its history.
    with TestClient(create_app(world.rt)) as client:
        view = client.get(f"/jobs/{job_id}").json()
        page = client.get("/nets").text
    assert (view["attempt"], view["max_attempts"]) == (2, 3)
    assert [(m["to_state"], m["attempt"]) for m in view["history"]] == moves

    # The nets page: the net's card and the jobs table.
    assert re.search(r"RUNNING</span> since [^<,]*, attempt 2 of 3<", page), page
    row = re.search(r'<td data-l="Attempt" class="nowrap">([^<]*)</td>', page)
    assert row is not None and row.group(1) == "2 of 3"

    # The CLI: its JSON is the API's view; its tables say the same.
    assert main(["jobs", "--json"]) == 0
    listed: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    assert [(j["attempt"], j["max_attempts"]) for j in listed] == [(2, 3)]
    assert main(["jobs"]) == 0
    table = capsys.readouterr().out
    assert "ATTEMPT" in table and " 2 of 3 " in table
    assert main(["job", str(job_id)]) == 0
    detail = capsys.readouterr().out
    assert re.search(r"^attempt +2 of 3$", detail, re.MULTILINE)
    assert not re.search(r"^attempts ", detail, re.MULTILINE)  # no second count beside it

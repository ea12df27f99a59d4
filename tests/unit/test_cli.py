"""The CLI against a migrated SQLite database, with settings from the environment."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sqlite3
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select

from app import names
from app.db import make_engine, session_factory
from app.entrypoints.cli import build_parser, main
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases import claims, declared_nets, records
from app.usecases import enqueue as enqueue_uc
from models import Job, JobEvent, JobState, Net, ScaleEvent
from models.states import JOB_TRANSITIONS, NET_TRANSITIONS, mermaid
from tests.fixtures.db import FrozenClock, net_decl

API_SECRET = "cli-api-secret-7f3a"
FLOWER_PASSWORD = "flower-pw-91c2"
SETTINGS_ALIASES = [f.alias for f in Settings.model_fields.values() if f.alias]


@pytest.fixture(autouse=True)
def _isolated_logging():
    # main() installs a handler on the root logger bound to the captured stderr; drop it so
    # later tests do not write into a closed capture.
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "fl-dispatcher"]:
        root.removeHandler(handler)


@pytest.fixture
def cli_env(monkeypatch, tmp_path, sqlite_url, job_root):
    """Settings for the CLI, from the environment only (as a deployed process gets them)."""
    for alias in SETTINGS_ALIASES:
        monkeypatch.delenv(alias, raising=False)
    nets = [
        net_decl(tmp_path, "net-a", "ecs", per_job_fl_server=True),
        net_decl(tmp_path, "net-b"),
    ]
    env = {
        "FL_DISPATCHER_DATA_DIR": str(tmp_path / "data"),
        "DATABASE_URL": sqlite_url,
        "BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        "JOB_ROOT": str(job_root),
        "NETS": json.dumps(nets),
        "API_SECRET": API_SECRET,
        "FLOWER_BASIC_AUTH": f"admin:{FLOWER_PASSWORD}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def db(cli_env, sqlite_url):
    engine = make_engine(sqlite_url)
    factory = session_factory(engine)
    yield factory
    engine.dispose()


@pytest.fixture
def world(db, cli_env):
    """Two nets; a job running on net-a (with a scale event), one queued, one aborted."""
    settings = Settings()
    clock = FrozenClock()
    with db.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
        ids = {}
        for key in ("first", "second", "third"):
            clock.advance(10)
            request = EnqueueJob(caller_key=key, definition="tiny-job", net="net-a")
            ids[key] = enqueue_uc.enqueue_job(session, settings, request, clock()).job_id
        clock.advance(5)
        assignment = claims.claim_next_job(session, settings, clock())
        assert assignment is not None and assignment.job_id == ids["first"]
        session.add(
            ScaleEvent(
                net_name="net-a",
                action="scale_up",
                replicas=1,
                reason="job assigned",
                outcome="ok",
                at=clock(),
            )
        )
        records.abort_job(session, ids["third"], "not needed", clock())
    return ids


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    for secret in (API_SECRET, FLOWER_PASSWORD):
        assert secret not in out and secret not in err, f"secret printed by {argv}"
    return code, out, err


def test_config_check_prints_the_redacted_configuration(capsys, cli_env, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://fl:db-pw-55@db.example/fl")
    code, out, _ = run(capsys, "config", "check")
    assert code == 0
    assert "configuration valid" in out  # its fake kits are warned about (test_config_warnings)
    assert "net-a" in out and "net-b" in out
    assert "db-pw-55" not in out
    assert "postgresql+psycopg://fl:***@db.example/fl" in out

    code, out, _ = run(capsys, "config", "check", "--json")
    data = json.loads(out)
    assert code == 0
    assert [n["name"] for n in data["nets"]] == ["net-a", "net-b"]
    assert [n["always_on"] for n in data["nets"]] == [False, True]
    assert "db-pw-55" not in out


def test_config_check_fails_with_the_message_on_a_bad_flag(capsys, cli_env, monkeypatch):
    monkeypatch.setenv("PER_JOB_FL_SERVER", "maybe")
    code, out, err = run(capsys, "config", "check")
    assert code == 2
    assert out == ""
    assert "PER_JOB_FL_SERVER='maybe' is not a boolean" in err
    assert "Traceback" not in err


def test_every_command_stops_on_bad_settings(capsys, cli_env, monkeypatch):
    monkeypatch.setenv("NETS", json.dumps([{"name": "net-x", "driver": {"kind": "static"}}]))
    for argv in (
        ["status"],
        ["jobs"],
        ["db", "check"],
        ["enqueue", "--key", "k", "--definition", "d"],
    ):
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        assert "net 'net-x'" in err and "admin" in err


def test_status_json_matches_the_database(capsys, db, world):
    code, out, _ = run(capsys, "status", "--json", "--no-probe")
    assert code == 0
    status = json.loads(out)
    nets = {n["name"]: n for n in status["nets"]}
    with db() as session:
        rows = {n.name: n for n in session.scalars(select(Net))}
        running = session.get(Job, world["first"])
        assert nets.keys() == rows.keys()
        for name, row in rows.items():
            assert nets[name]["state"] == row.state.value
        assert nets["net-a"]["active_job"]["id"] == str(running.id)
        assert nets["net-a"]["active_job"]["state"] == running.state.value == "ASSIGNED"
    assert nets["net-b"]["active_job"] is None
    assert nets["net-a"]["last_scale_event"]["action"] == "scale_up"
    assert nets["net-b"]["last_scale_event"] is None
    assert nets["net-a"]["always_on"] is False and nets["net-b"]["always_on"] is True
    assert status["queue"]["queued"] == 1
    assert status["probed"] is False
    assert {n["server_state"] for n in status["nets"]} == {"not_probed"}


def test_status_probes_and_reports_a_broken_admin_kit_per_net(capsys, world):
    # Real adapters: net-b's static driver answers, and its admin kit is an empty file, so
    # its admin probe fails (or times out) on its own while the command still succeeds.
    code, out, _ = run(capsys, "status", "--json", "--probe-timeout", "2")
    assert code == 0
    nets = {n["name"]: n for n in json.loads(out)["nets"]}
    assert nets["net-b"]["driver"] == {"desired": 1, "running": 1, "pending": 0, "failure": None}
    # Whatever the admin adapter makes of the kit, it is net-b's own finding.
    if nets["net-b"]["server_state"] == "unknown":
        assert nets["net-b"]["error"].startswith("admin: ")
    else:
        assert nets["net-b"]["server_state"] == "unreachable"


def test_status_table(capsys, world):
    code, out, _ = run(capsys, "status", "--no-probe")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NET", "STATE", "ALWAYS-ON"]
    assert any(line.startswith("net-a") and str(world["first"]) in line for line in lines)
    assert "queued jobs: 1" in out


def test_jobs_json_matches_the_database(capsys, db, world):
    code, out, _ = run(capsys, "jobs", "--json")
    assert code == 0
    listed = json.loads(out)
    with db() as session:
        jobs = session.scalars(select(Job).order_by(Job.created_at.desc())).all()
        assert [j["id"] for j in listed] == [str(j.id) for j in jobs]
        assert [j["state"] for j in listed] == [j.state.value for j in jobs]
        assert [j["caller_key"] for j in listed] == [j.caller_key for j in jobs]

    code, out, _ = run(capsys, "jobs", "--state", "queued", "--json")
    assert [j["id"] for j in json.loads(out)] == [str(world["second"])]


def test_jobs_rejects_an_unknown_state(capsys, world):
    code, _, err = run(capsys, "jobs", "--state", "SLEEPING")
    assert code == 1
    assert "unknown job state 'SLEEPING'" in err and "QUEUED" in err


def test_job_json_has_the_history(capsys, db, world):
    code, out, _ = run(capsys, "job", str(world["first"]), "--json")
    assert code == 0
    job = json.loads(out)
    with db() as session:
        events = session.scalars(
            select(JobEvent).where(JobEvent.job_id == world["first"]).order_by(JobEvent.id)
        ).all()
    assert job["state"] == "ASSIGNED" and job["net"] == "net-a"
    assert [(e["from_state"], e["to_state"]) for e in job["history"]] == [
        (e.from_state and e.from_state.value, e.to_state.value) for e in events
    ]
    assert [e["to_state"] for e in job["history"]] == ["QUEUED", "ASSIGNED"]

    code, out, _ = run(capsys, "job", str(world["first"]))
    assert code == 0 and "history:" in out and "ASSIGNED" in out


def test_job_by_caller_key_shows_the_reason_code_of_its_end(capsys, world):
    code, out, _ = run(capsys, "job", "--key", "third", "--json")
    assert code == 0
    job = json.loads(out)
    assert (job["id"], job["state"], job["reason_code"]) == (
        str(world["third"]),
        "ABORTED",
        "aborted",
    )
    assert job["history"][-1]["reason_code"] == "aborted"
    code, out, _ = run(capsys, "job", "--key", "third")
    assert code == 0 and "reason_code       aborted" in out
    code, _, err = run(capsys, "job", "--key", "nobody")
    assert code == 1 and "no job with caller_key 'nobody'" in err
    code, _, err = run(capsys, "job")
    assert code == 1 and "give a job ID or --key" in err


def test_job_unknown_and_malformed_ids(capsys, world):
    code, _, err = run(capsys, "job", str(uuid.uuid4()))
    assert code == 1 and "not found" in err
    with pytest.raises(SystemExit) as exc:
        main(["job", "not-a-uuid"])
    assert exc.value.code == 2
    assert "is not a job id" in capsys.readouterr().err


def broker_messages(cli_env) -> list[str]:
    """What the CLI left on the dispatcher's queues, in the order it was sent."""
    path = cli_env["BROKER_URL"].removeprefix("sqla+sqlite:///")
    marks = ", ".join("?" * len(names.QUEUES))
    with sqlite3.connect(path) as conn:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'kombu_message'").fetchone():
            return []  # kombu makes its tables with the first message: none was sent
        return [
            payload
            for (payload,) in conn.execute(
                "SELECT m.payload FROM kombu_message m JOIN kombu_queue q ON m.queue_id = q.id"
                f" WHERE q.name IN ({marks}) ORDER BY m.id",
                names.QUEUES,
            )
        ]


def test_enqueue_is_idempotent_and_sends_assign_to_the_workers_queue(capsys, db, cli_env):
    argv = ["enqueue", "--key", "cli-1", "--definition", "tiny-job", "--site", "site-9"]
    code, out, _ = run(capsys, *argv, "--net", "net-b", "--priority", "5", "--json")
    assert code == 0
    first = json.loads(out)
    assert first["created"] is True and first["state"] == "QUEUED" and first["notified"] is True
    code, out, _ = run(capsys, *argv, "--net", "net-b", "--priority", "5", "--json")
    assert json.loads(out)["job_id"] == first["job_id"]
    assert json.loads(out)["created"] is False
    # The same key with another payload is refused, saying so, and changes nothing.
    code, out, err = run(capsys, *argv, "--json")
    assert (code, out) == (1, "")
    assert "already names job" in err and "different payload" in err
    with db() as session:
        job = session.scalars(select(Job)).one()
        assert (job.required_sites, job.requested_net, job.priority) == (["site-9"], "net-b", 5)
    # One kick: no worker took the first before the repeat, so the repeat's is coalesced
    # into it (app.usecases.kicks).
    messages = broker_messages(cli_env)
    assert task_names(messages) == ["fl_dispatcher.assign_next_job"]


def test_enqueue_names_the_prewarm_sent_for_the_job(capsys, db, cli_env):
    argv = ["enqueue", "--key", "cli-pk", "--definition", "tiny-job", "--net", "net-b"]
    code, _, _ = run(capsys, *argv, "--prewarm-key", "pw-1")
    assert code == 0
    with db() as session:
        assert session.scalars(select(Job.prewarm_key)).one() == "pw-1"
    code, _, err = run(capsys, *argv, "--prewarm-key", "pw-2")
    assert code == 1 and "differs in: prewarm_key" in err
    code, _, err = run(capsys, *argv, "--prewarm-key", "bad key!")
    assert code == 1 and "prewarm_key" in err


def test_enqueue_bad_input_writes_nothing(capsys, db, cli_env):
    code, _, err = run(capsys, "enqueue", "--key", "bad key!", "--definition", "tiny-job")
    assert code == 1 and "caller_key" in err
    code, _, err = run(capsys, "enqueue", "--key", "k2", "--definition", "../etc", "--net", "net-a")
    assert code == 1 and "without '..'" in err
    code, _, err = run(
        capsys, "enqueue", "--key", "k3", "--definition", "tiny-job", "--net", "nope"
    )
    assert code == 1 and "unknown net 'nope'" in err
    with db() as session:
        assert session.scalars(select(Job)).all() == []


def test_prewarm_starts_the_net_and_sends_the_warm_up_then_cancel_ends_it(capsys, db, cli_env):
    argv = ["prewarm", "--key", "cli-p1", "--net", "net-a", "--within", "90", "--json"]
    code, out, _ = run(capsys, *argv)
    first = json.loads(out)
    assert code == 0 and first["created"] is True and first["status"] == "warming"
    assert first["notified"] is True
    code, out, _ = run(capsys, *argv)
    assert code == 0 and json.loads(out)["created"] is False
    # The repeat finds its net still STARTING: the warm-up goes again (idempotent), in case
    # the first send was lost with a commit's reply.
    assert task_names(broker_messages(cli_env)) == ["fl_dispatcher.warm_up"] * 2
    code, out, _ = run(capsys, "status", "--no-probe")
    assert "PREWARM" in out and "cli-p1 warming until" in out
    code, out, _ = run(capsys, "cancel-prewarm", "cli-p1")
    assert code == 0 and out == "prewarm cli-p1: cancelled (net net-a)\n"
    code, _, err = run(capsys, "cancel-prewarm", "nope")
    assert code == 1 and "no prewarm with caller_key 'nope'" in err


def test_prewarm_refusals_exit_1_with_their_reason_code(capsys, db, cli_env):
    with db.begin() as session:
        declared_nets.sync_nets(session, Settings(), FrozenClock()())
        declared_nets.mark_misconfigured(session, "net-a", "wrong kit", FrozenClock()())
    code, out, err = run(capsys, "prewarm", "--key", "p", "--net", "net-a", "--within", "9")
    assert (code, out) == (1, "")
    assert "MISCONFIGURED: wrong kit" in err and "(reason_code: net_misconfigured)" in err
    code, _, err = run(capsys, "prewarm", "--key", "p", "--net", "net-a", "--within", "0")
    assert code == 1 and "within_s" in err
    assert not os.path.exists(cli_env["BROKER_URL"].removeprefix("sqla+sqlite:///"))  # none sent


def task_names(messages: list[str]) -> list[str]:
    """The Celery task name of each broker message (protocol 2 keeps it in the headers)."""
    return [json.loads(m)["headers"]["task"] for m in messages]


def task_kwargs(message: str) -> dict:
    """The kwargs of a broker message: the body is [args, kwargs, embed], base64 JSON."""
    return json.loads(base64.b64decode(json.loads(message)["body"]))[1]


def test_abort_a_queued_job(capsys, db, world, cli_env):
    code, out, _ = run(capsys, "abort", str(world["second"]), "--json")
    assert code == 0
    assert json.loads(out) == {
        "job_id": str(world["second"]),
        "state": "ABORTED",
        "needs_server_abort": False,
        "notified": True,
    }
    with db() as session:
        assert session.get(Job, world["second"]).state == JobState.ABORTED
    # The only QUEUED job is gone: no job waits for the assigner, so no kick is sent (an
    # empty assign kick is one read, app/usecases/kicks.py).
    assert task_names(broker_messages(cli_env)) == []


def test_abort_a_dispatching_job_sends_only_the_server_abort(capsys, db, world, cli_env):
    with db.begin() as session:  # it may have reached its server: only a worker can tell
        records.get_job(session, world["first"]).start_dispatch(FrozenClock()())
    code, out, _ = run(capsys, "abort", str(world["first"]), "--json")
    assert code == 0
    assert json.loads(out)["state"] == "ABORTING"
    assert json.loads(out)["needs_server_abort"] is True
    assert json.loads(out)["notified"] is True
    # The SQL abort ran here; the worker is asked for the server part only (sending the
    # public abort task would run the SQL abort a second time).
    messages = broker_messages(cli_env)
    assert task_names(messages) == ["fl_dispatcher.abort_on_server"]
    assert task_kwargs(messages[0]) == {"job_id": str(world["first"])}
    with db() as session:
        assert session.get(Job, world["first"]).state == JobState.ABORTING


def test_drain_and_undrain_answer_json_and_undrain_kicks_the_assigner(capsys, db, world, cli_env):
    """app/entrypoints/README.md "Drain before a redeploy": net-a holds the ASSIGNED first
    job and the second waits for it."""
    code, out, _ = run(capsys, "drain", "net-a", "--reason", "release 0.3.0", "--json")
    assert code == 0
    drained = json.loads(out)
    assert (drained["state"], drained["complete"], drained["queued"]) == ("draining", False, 1)
    assert [(n["name"], n["active_job"]["state"]) for n in drained["nets"]] == [
        ("net-a", "ASSIGNED")
    ]
    code, out, _ = run(capsys, "status", "--json", "--no-probe")
    status = json.loads(out)
    assert status["drain"]["state"] == "draining"
    assert [(n["name"], n["drained"]) for n in status["nets"]] == [
        ("net-a", True),
        ("net-b", False),
    ]
    code, out, _ = run(capsys, "status", "--no-probe")
    assert "STARTING (drained)" in out and "drain: DRAINING (net-a)" in out
    code, out, _ = run(capsys, "job", str(world["second"]), "--json")
    assert json.loads(out)["waiting_for"].startswith("net drained: net net-a")
    assert broker_messages(cli_env) == []  # a drain tells no worker

    code, _, err = run(capsys, "undrain", "--all", "net-a")
    assert code == 1 and "name the nets to drain or undrain, or ask for all" in err
    code, out, _ = run(capsys, "undrain", "net-a", "--json")
    assert code == 0
    assert json.loads(out)["state"] == "none" and json.loads(out)["notified"] is True
    assert task_names(broker_messages(cli_env)) == [names.ASSIGN_NEXT_JOB]


def test_drain_wait_says_when_the_drain_is_not_complete(capsys, db, world, cli_env):
    code, out, err = run(capsys, "drain", "--all", "--wait", "0")
    assert code == 1 and "drain: not complete after 0s" in err
    assert "drain: DRAINING (the whole deployment since" in out
    with db.begin() as session:  # the ASSIGNED job ends: nothing active left
        records.abort_job(session, world["first"], "done", FrozenClock()())
    code, out, _ = run(capsys, "drain", "--all", "--wait", "0")
    assert code == 0 and "safe to stop the processes and deploy" in out


def test_db_commands(capsys, cli_env, monkeypatch, tmp_path):
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    monkeypatch.setenv("DATABASE_URL", fresh)
    assert run(capsys, "db", "upgrade")[0] == 0
    assert run(capsys, "db", "check")[0] == 0
    code, out, _ = run(capsys, "db", "downgrade", "base")
    assert code == 0 and "base" in out
    with sqlite3.connect(tmp_path / "fresh.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "jobs" not in tables


def test_diagram_prints_both_tables_without_settings(capsys, monkeypatch):
    monkeypatch.setenv("PER_JOB_FL_SERVER", "maybe")  # settings would fail; not needed here
    assert main(["diagram"]) == 0
    out = capsys.readouterr().out
    assert mermaid(JOB_TRANSITIONS) in out and mermaid(NET_TRANSITIONS) in out


def test_worker_and_beat_start_with_the_loaded_settings(capsys, cli_env, monkeypatch):
    import app.celery_app

    calls = []
    monkeypatch.setattr(
        app.celery_app, "run_worker", lambda s, **kw: calls.append(("worker", s, kw))
    )
    monkeypatch.setattr(app.celery_app, "run_beat", lambda s: calls.append(("beat", s, {})))
    assert run(capsys, "worker", "--beat", "--concurrency", "3")[0] == 0
    assert run(capsys, "beat")[0] == 0
    assert run(capsys, "worker", "-Q", f"{names.QUEUE}, {names.PIPELINE_QUEUE}")[0] == 0
    assert [(c[0], c[2]) for c in calls] == [
        ("worker", {"concurrency": 3, "beat": True, "queues": []}),
        ("beat", {}),
        (
            "worker",
            {"concurrency": 2, "beat": False, "queues": [names.QUEUE, names.PIPELINE_QUEUE]},
        ),
    ]
    assert all(isinstance(c[1], Settings) for c in calls)


def test_a_worker_on_an_unknown_queue_does_not_start(capsys, cli_env):
    # A typo would start a worker that waits on a queue nobody sends to.
    with pytest.raises(SystemExit) as exc:
        main(["worker", "-Q", f"{names.QUEUE},fl_dispatcher.housekeep"])
    assert exc.value.code == 2
    assert "unknown queue(s) fl_dispatcher.housekeep" in capsys.readouterr().err


def test_ready_reports_which_dependency_failed(capsys, cli_env, monkeypatch):
    code, out, _ = run(capsys, "ready")
    assert code == 0 and "reachable" in out
    monkeypatch.setenv("BROKER_URL", "redis://127.0.0.1:1/0")
    code, _, err = run(capsys, "ready", "--timeout", "2")
    assert code == 1 and "broker not ready" in err and "database" not in err


def test_parser_lists_every_command():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {
        "config", "status", "jobs", "job", "enqueue", "abort", "db",
        "diagram", "schema", "api", "ready", "worker", "beat", "demo", "simulate",
        "participant", "prewarm", "cancel-prewarm", "local-net", "drain", "undrain",
    }  # fmt: skip


def test_oldest_queued_job_shows_in_the_table(capsys, db, world):
    with db.begin() as session:
        job = session.get(Job, world["second"])
        job.created_at -= timedelta(hours=1)
    code, out, _ = run(capsys, "status", "--no-probe")
    assert code == 0 and "oldest since" in out


def test_no_net_row_is_reported_not_crashed(capsys, cli_env):
    # A fresh database before any worker started: nets have no rows yet.
    code, out, _ = run(capsys, "status", "--json", "--no-probe")
    assert code == 0
    for net in json.loads(out)["nets"]:
        assert net["state"] is None and "no database row" in net["error"]


def loaded_after(script: str, *args: str) -> dict:
    """Run `script` in a fresh interpreter; it writes what it found as JSON to argv[1]."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        result_file = Path(folder) / "result.json"
        subprocess.run(
            [sys.executable, "-c", script, str(result_file), *args],
            check=True,
            capture_output=True,
            timeout=120,
        )
        return json.loads(result_file.read_text())


LOADED_HTTP = """
import json, sys
loaded = lambda: sorted(m for m in sys.modules if m.split(".")[0] in {"fastapi", "starlette",
    "uvicorn"} or m == "app.entrypoints.api")
"""


def test_importing_the_cli_loads_no_http_stack():
    script = LOADED_HTTP + (
        "import app.entrypoints.cli\n"
        "open(sys.argv[1], 'w').write(json.dumps({'loaded': loaded()}))\n"
    )
    assert loaded_after(script) == {"loaded": []}


def test_cli_commands_other_than_api_load_no_http_stack(db, world):
    # Every command that reads or writes the job store, run in one fresh interpreter.
    script = LOADED_HTTP + (
        "from app.entrypoints.cli import main\n"
        "codes = [main(a.split()) for a in sys.argv[2:]]\n"
        "open(sys.argv[1], 'w').write(json.dumps({'codes': codes, 'loaded': loaded()}))\n"
    )
    commands = [
        "status --no-probe",
        "status --probe-timeout 1",
        "jobs --state queued",
        f"job {world['first']}",
        "enqueue --key cli-http --definition tiny-job --net net-a",
        f"abort {world['second']}",
        "ready --timeout 2",
        "config check",
    ]
    assert loaded_after(script, *commands) == {"codes": [0] * len(commands), "loaded": []}


SCHEMA_SAMPLES = [
    ("fl_dispatcher.enqueue_job", {"caller_key": "flip-1", "definition": "fedavg"}, True),
    (
        "fl_dispatcher.enqueue_job",
        {
            "caller_key": "flip-1",
            "definition": "s3://bucket/job",
            "required_sites": ["site-1"],
            "net": "net-1",
            "priority": -5,
            "max_attempts": 3,
        },
        True,
    ),
    ("fl_dispatcher.enqueue_job", {"caller_key": "bad key!", "definition": "d"}, False),
    ("fl_dispatcher.enqueue_job", {"caller_key": "k", "definition": "d", "colour": 1}, False),
    ("fl_dispatcher.enqueue_job", {"caller_key": "k", "definition": "d", "priority": 1001}, False),
    ("fl_dispatcher.enqueue_job", {"caller_key": "k", "definition": "d", "net": "Net 1"}, False),
    ("fl_dispatcher.enqueue_job", {"caller_key": "k"}, False),
    ("fl_dispatcher.abort_job", {"job_id": str(uuid.uuid4())}, True),
    ("fl_dispatcher.abort_job", {"job_id": str(uuid.uuid4()), "reason": "x" * 501}, False),
    ("fl_dispatcher.abort_job", {"reason": "no id"}, False),
    ("fl_dispatcher.abort_job", {"job_id": "not-a-uuid"}, False),
    (
        "fl_dispatcher.report_job_status",
        {"job_id": str(uuid.uuid4()), "status": "results_uploaded", "detail": "ok"},
        True,
    ),
    ("fl_dispatcher.report_job_status", {"job_id": str(uuid.uuid4()), "status": "done"}, False),
    ("fl_dispatcher.prewarm", {"caller_key": "p-1", "net": "net-1", "within_s": 120}, True),
    ("fl_dispatcher.prewarm", {"caller_key": "p-1", "required_sites": ["s"], "within_s": 1}, True),
    ("fl_dispatcher.prewarm", {"caller_key": "p-1", "net": "net-1"}, False),
    ("fl_dispatcher.prewarm", {"caller_key": "p-1", "net": "net-1", "within_s": 0}, False),
    ("fl_dispatcher.prewarm", {"caller_key": "p-1", "within_s": 86401}, False),
    ("fl_dispatcher.prewarm", {"caller_key": "p 1", "within_s": 60}, False),
    ("fl_dispatcher.cancel_prewarm", {"caller_key": "p-1"}, True),
    ("fl_dispatcher.cancel_prewarm", {}, False),
]


def test_schema_prints_the_public_payloads_by_task_name_without_settings(capsys, monkeypatch):
    import jsonschema
    from pydantic import ValidationError

    from app.schemas import PUBLIC_PAYLOADS

    monkeypatch.setenv("PER_JOB_FL_SERVER", "maybe")  # settings would fail; not needed here
    assert main(["schema"]) == 0
    schemas = json.loads(capsys.readouterr().out)["tasks"]
    assert set(schemas) == {
        "fl_dispatcher.enqueue_job",
        "fl_dispatcher.abort_job",
        "fl_dispatcher.report_job_status",
        "fl_dispatcher.prewarm",
        "fl_dispatcher.cancel_prewarm",
    }
    # A caller validating with any JSON Schema tool accepts and rejects what the worker does.
    for task, payload, valid in SCHEMA_SAMPLES:
        validator = jsonschema.Draft202012Validator(
            schemas[task], format_checker=jsonschema.FormatChecker()
        )
        jsonschema.Draft202012Validator.check_schema(schemas[task])
        assert validator.is_valid(payload) is valid, (task, payload)
        try:
            PUBLIC_PAYLOADS[task].model_validate(payload)
        except ValidationError:
            accepted = False
        else:
            accepted = True
        assert accepted is valid, (task, payload)


def _parsers(parser: argparse.ArgumentParser, path: str = "fl-dispatcher"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_option_and_argument_has_help_text():
    missing = [
        f"{path} {action.option_strings or action.dest}"
        for path, parser in _parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction | argparse._HelpAction)
        and not action.help
    ]
    assert missing == []


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"fl-dispatcher {version('fl-dispatcher')}"


def test_enqueue_takes_metadata_as_a_json_object(capsys, db, cli_env):
    argv = ["enqueue", "--key", "meta-1", "--definition", "tiny-job", "--net", "net-a"]
    code, _, _ = run(capsys, *argv, "--metadata", '{"model_id": "m-42"}', "--json")
    assert code == 0
    with db() as session:
        assert session.scalars(select(Job)).one().metadata_ == {"model_id": "m-42"}
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--metadata", "[1, 2]"])
    assert exc.value.code == 2
    assert "must be a JSON object" in capsys.readouterr().err


class _ChattyAdmin:
    """A net's admin client that, like NVFLARE 2.9's, prints to stdout while connecting
    (with NVFLARE's own printer), then answers."""

    def server_state(self):
        from nvflare.fuel.hci.client.api import _print_hci_message

        from app.adapters.backend import ServerState

        _print_hci_message("Connecting to FLARE ...")
        return ServerState.STARTED

    def connected_sites(self) -> list[str]:
        return ["site-1"]

    def close(self) -> None:
        pass


def test_every_json_command_prints_only_json_while_a_net_is_probed(
    capsys, world, cli_env, monkeypatch
):
    from app.entrypoints import cli_jobs
    from app.runtime import Runtime
    from tests.fakes import FakeDriver

    def chatty_runtime(settings):
        return Runtime.from_settings(
            settings,
            admin_factory=lambda net, s: _ChattyAdmin(),
            driver_factory=lambda net, s: FakeDriver(),
        )

    monkeypatch.setattr(cli_jobs, "_runtime", chatty_runtime)
    # nvflare's first import takes seconds on a loaded machine: done here, not inside the
    # probe, whose deadline is long enough for the print it must see go to stderr.
    import nvflare.fuel.hci.client.api  # noqa: F401

    enqueue = ["enqueue", "--key", "json-1", "--definition", "tiny-job", "--net", "net-a"]
    commands = [
        ["config", "check", "--json"],
        ["status", "--json", "--probe-timeout", "60"],
        ["jobs", "--json"],
        ["job", str(world["first"]), "--json"],
        [*enqueue, "--json"],
        ["abort", str(world["second"]), "--json"],
    ]
    for argv in commands:
        code, out, err = run(capsys, *argv)
        assert code == 0, (argv, err)
        json.loads(out)  # nothing but the document
        if argv[0] == "status":
            assert "Connecting to FLARE" in err  # it was printed, and went to stderr


def test_a_database_without_tables_says_to_run_db_upgrade(capsys, cli_env, tmp_path, monkeypatch):
    sqlite3.connect(tmp_path / "empty.db").close()  # a database file with no table
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    code, out, err = run(capsys, "jobs")
    assert (code, out) == (1, "")
    assert "run `fl-dispatcher db upgrade` on sqlite:///" in err and "empty.db" in err


def test_db_commands_are_quiet_about_alembic_plugins(cli_env, tmp_path):
    """A fresh process (Alembic sets its plugins up once per process, on first use)."""
    import subprocess
    import sys

    env = {**os.environ, **cli_env, "DATABASE_URL": f"sqlite:///{tmp_path / 'quiet.db'}"}
    for argv in (["db", "upgrade"], ["db", "check"]):
        done = subprocess.run(
            [sys.executable, "-m", "app.entrypoints.cli", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "plugin" not in done.stderr and "plugin" not in done.stdout


def test_config_check_says_loudly_where_an_unset_data_folder_is(
    capsys, cli_env, monkeypatch, tmp_path
):
    monkeypatch.delenv("FL_DISPATCHER_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "config", "check", "--json")
    assert code == 0
    where = str(tmp_path.resolve() / ".fl-dispatcher")
    assert json.loads(out)["FL_DISPATCHER_DATA_DIR"] == where  # absolute, resolved at start
    assert f"FL_DISPATCHER_DATA_DIR is unset, so the data folder is {where}" in err
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(tmp_path / "set"))
    _, _, err = run(capsys, "config", "check", "--json")
    assert "unset" not in err


def test_an_enqueue_an_early_abort_ends_at_once_says_so_not_queued(capsys, db, cli_env):
    """An abort kept for a job id before its enqueue (`early_aborts`): the enqueue stores
    the job QUEUED then ABORTED, and the CLI's line said "queued: job ... (ABORTED)"."""
    from app.schemas import job_id_for
    from models import EarlyAbort
    from models.base import utcnow

    now = utcnow()
    with db() as session, session.begin():
        session.add(
            EarlyAbort(
                job_id=job_id_for("cli-early"),
                reason="user",
                reason_code="aborted",
                asked_at=now,
                kept_until=now + timedelta(hours=1),
            )
        )
    argv = ["enqueue", "--key", "cli-early", "--definition", "tiny-job", "--net", "net-b"]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert out == f"stored, aborted at once (an abort came first): job {job_id_for('cli-early')}\n"

"""A job bundle whose pyproject.toml is malformed (valid TOML whose `tool`, `flwr`, `app` or
app config is no table; bytes that are not UTF-8) is the job's fault: the submit refuses it
as an invalid definition (the job FAILED at once, `definition_invalid`), never with an
error nobody classified, which a pipeline step raises loudly and the lease re-drives until
the job has spent its attempts, holding its net each time."""

from __future__ import annotations

import random
import tracemalloc
import uuid
from pathlib import Path

import pytest

from app.adapters.flower import fab
from app.adapters.jobdefs import is_flower_app, prepare
from app.errors import InvalidRequest
from app.settings import Settings
from app.usecases import dispatch, records
from app.usecases.dispatch import Step
from models import JobState, ReasonCode
from tests.unit.test_flower_dispatch_race import (
    NET,
    World,
    _worker,
    enqueue,
    flower_settings,  # noqa: F401 (a fixture)
)

COMPONENTS = '[tool.flwr.app.components]\nserverapp = "a.server:app"\n'
MALFORMED: dict[str, bytes] = {
    "tool is a string": b'tool = "x"\n',
    "flwr is a string": b'[tool]\nflwr = "x"\n',
    "app is a number": b"[tool.flwr]\napp = 3\n",
    "config is a string": f'[tool.flwr.app]\nconfig = "x"\n{COMPONENTS}'.encode(),
    "config is an array of tables": f"{COMPONENTS}[[tool.flwr.app.config]]\nx = 1\n".encode(),
    "not UTF-8": b"\xff\xfe" + COMPONENTS.encode(),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_pyproject_is_an_invalid_definition(case: str, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_bytes(MALFORMED[case])
    with pytest.raises(InvalidRequest, match=r"pyproject\.toml"):
        fab.build_fab(tmp_path)


@pytest.mark.parametrize("case", ["tool is a string", "flwr is a string", "not UTF-8"])
def test_a_malformed_pyproject_makes_no_flower_app_for_the_nvflare_copy(
    case: str, tmp_path: Path
) -> None:
    """prepare() asks every bundle whether it is a Flower App, whatever the net's backend:
    an NVFLARE bundle with a stray pyproject.toml must not crash it."""
    bundle = tmp_path / "job"
    (bundle / "app" / "config").mkdir(parents=True)
    (bundle / "pyproject.toml").write_bytes(MALFORMED[case])
    assert is_flower_app(bundle) is False
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=tmp_path)
    assert prepare(settings, bundle, uuid.uuid4(), ["site-1"], None) != bundle


def test_a_malformed_flower_app_fails_its_job_at_once(
    flower_settings: Settings,  # noqa: F811
    sqlite_factory,
    clock,
) -> None:
    superlink = World(real=True)
    superlink.later(100.0)
    rt = _worker(flower_settings, sqlite_factory, clock, superlink.api)
    app = flower_settings.job_root / "flower-app" / "pyproject.toml"
    # Its config an array of tables: valid TOML, a Flower App's header, no config table.
    app.write_text(app.read_text().replace("[tool.flwr.app.config]", "[[tool.flwr.app.config]]"))
    job_id, attempt = enqueue(rt, sqlite_factory, clock)

    result = dispatch.dispatch(rt, job_id, NET, attempt)

    assert result.step == Step.GAVE_UP
    with sqlite_factory() as session:
        job = records.get_job(session, job_id)
        assert (job.state, job.reason_code) == (JobState.FAILED, ReasonCode.DEFINITION_INVALID)
    assert superlink.server.store == {}


def test_a_huge_app_is_refused_without_holding_it_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SuperLink takes a FAB of 10 MB at most, while a bundle may hold gigabytes
    (S3_MAX_BUNDLE_BYTES, 2 GiB by default) of files the FAB packs (`.json` data): the
    build stops once its bundle passes the limit, holding no more than about that in
    memory, instead of reading every file first (a worker's memory limit kills it, and its
    message comes back to kill the next)."""
    monkeypatch.setattr(fab, "FAB_MAX_BYTES", 1024 * 1024)
    (tmp_path / "pyproject.toml").write_text(COMPONENTS)
    for i in range(4):
        (tmp_path / f"data-{i}.json").write_bytes(random.Random(i).randbytes(8 * 1024 * 1024))
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest, match="over the SuperLink's"):
            fab.build_fab(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * 1024 * 1024, f"{peak:,} bytes held for a FAB limited to 1 MiB"

"""Break of round 23's change 1 (app/adapters/jobdefs.py) for a Flower App.

Promise (changelog Unreleased): "a job folder submits nothing from outside JOB_ROOT. A file
... in it that links out of the root ... fails the job definition_invalid"; the commit says
"checked before the copy and again per file as it is copied". An NVFLARE bundle is copied
(`_copy_within` checks each file again); a Flower App is not copied: `prepare` checks its
links once and returns the live job folder, and the Flower client's `build_fab` packs that
folder later (after the submit's hold is stored, a database round trip away) reading every
file through whatever link it holds then, with no check of its own. A link planted between
the two (the same race the NVFLARE copy closes) is packed into the FAB the SuperLink gets.
"""

from __future__ import annotations

import io
import zipfile

from app.adapters.flower import client as flower_client
from app.settings import Settings
from app.usecases import dispatch, unknown_submit
from tests.unit.test_flower_dispatch_race import (
    NET,
    World,
    _worker,
    enqueue,
    flower_settings,  # noqa: F401 (a fixture)
)

SECRET = "-----BEGIN PRIVATE KEY----- admin-kit-key-flower-77"


def test_a_link_out_of_the_root_planted_after_the_check_is_not_packed_into_the_fab(
    flower_settings: Settings,  # noqa: F811
    sqlite_factory,
    clock,
    tmp_path,
    monkeypatch,
) -> None:
    outside = tmp_path / "kits" / "client.key"
    outside.parent.mkdir(parents=True)
    outside.write_text(SECRET)
    folder = flower_settings.job_root / "flower-app"
    superlink = World(real=True)
    superlink.later(100.0)
    rt = _worker(flower_settings, sqlite_factory, clock, superlink.api)
    job_id, attempt = enqueue(rt, sqlite_factory, clock)

    held = unknown_submit.hold_submit

    def hold_then_plant(*args, **kwargs):
        # The folder changes after prepare() checked it, before the client packs it.
        (folder / "weights.json").symlink_to(outside)
        return held(*args, **kwargs)

    packed: list[bytes] = []
    build = flower_client.build_fab

    def recording_build(job_folder):
        fab = build(job_folder)
        packed.append(fab)
        return fab

    monkeypatch.setattr(unknown_submit, "hold_submit", hold_then_plant)
    monkeypatch.setattr(flower_client, "build_fab", recording_build)

    dispatch.dispatch(rt, job_id, NET, attempt)

    sent = b""
    for fab in packed:
        with zipfile.ZipFile(io.BytesIO(fab)) as archive:
            sent += b"".join(archive.read(name) for name in archive.namelist())
    assert SECRET.encode() not in sent, (
        "a file linked out of JOB_ROOT after prepare()'s check was packed into the FAB sent "
        "to the SuperLink (build_fab follows links, unchecked)"
    )

"""A Flower App is packed from its checked copy (app/adapters/jobdefs.py `prepare`,
app/adapters/bundle_copy.py), not from the live job folder: a link out of JOB_ROOT planted
after the check (while the submit's hold is stored) is never packed into the FAB the
SuperLink gets, as an NVFLARE bundle's copy never holds one."""

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

"""A net's declared site names are names PostgreSQL can hold: the claim and the idle check
ask it whether a job's sites are among a net's (`app.usecases.site_fit`, jsonb), and a NUL
or a lone surrogate in one made every claim round raise on PostgreSQL while that net was a
candidate (break-it 20). Refused when the settings are read, naming the site; no job can
need such a site (enqueue refuses a payload holding one)."""

from __future__ import annotations

import json

import pytest

from app.errors import SettingsError
from app.settings import Settings
from tests.fixtures.db import net_decl


@pytest.mark.parametrize("field", ["sites", "required_sites"])
@pytest.mark.parametrize(
    ("site", "problem"),
    [("site-\x00old", "holds a NUL character"), ("site-\ud800", "holds a lone surrogate")],
    ids=["nul", "lone-surrogate"],
)
def test_a_site_name_postgresql_cannot_hold_is_refused_when_the_settings_are_read(
    tmp_path, job_root, field, site, problem
):
    net = net_decl(tmp_path, "net-a", sites=["site-1", site])
    if field == "required_sites":
        net["required_sites"] = [site]
    with pytest.raises((SettingsError, ValueError), match=problem):
        Settings(FL_DISPATCHER_DATA_DIR=tmp_path / "d", JOB_ROOT=job_root, NETS=json.dumps([net]))


def test_site_names_postgresql_holds_are_taken_as_written(tmp_path, job_root):
    """Quotes, commas, accents and emoji are names like any other."""
    sites = ["site-1", "site-2", 'hôpital "B"', "site,3", "site-🏥"]
    net = net_decl(tmp_path, "net-a", sites=sites)
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "d", JOB_ROOT=job_root, NETS=json.dumps([net])
    )
    assert settings.net("net-a").sites == tuple(sites)
